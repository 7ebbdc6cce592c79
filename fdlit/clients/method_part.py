"""What a client reads of its method's client part (``fdlit.methods.ClientPart`` declares each of
these, with its meaning); the client layer sits below the methods, so it names the part by this shape."""

from __future__ import annotations

from typing import Protocol

import torch

from fdlit.clients.loss_context import LossContext


class MethodPart(Protocol):
    label: str | None
    needs_features: bool
    rowwise_loss: bool

    @property
    def has_loss(self) -> bool: ...

    def client_network(self, model: torch.nn.Module, seed: int) -> torch.nn.Module: ...

    def loss(self, ctx: LossContext) -> torch.Tensor: ...
