"""A user's own LightningModule as the client's network (``model.class_path``): where it sits in the
client's model, and its steps as the client's two phases."""

from __future__ import annotations

import torch

from fdlit.clients.lightning_import import LightningModule


def find_own_module(model: torch.nn.Module) -> LightningModule | None:
    """The user's LightningModule when it is the client's network (after the dataset's input module, if any)."""
    from fdlit.data.augment import WithInput

    net = model.net if isinstance(model, WithInput) else model
    # a ClientModule (fdlit's own client, marked ``is_fdlit_client``) is never a user's network
    return net if isinstance(net, LightningModule) and not getattr(net, "is_fdlit_client", False) else None


def step_loss(returned) -> torch.Tensor:
    """The loss of a Lightning step's return value: a tensor or a dict with ``"loss"``."""
    loss = returned["loss"] if isinstance(returned, dict) else returned
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"a training step must return a loss tensor or a dict with 'loss'; got {type(returned).__name__}")
    return loss
