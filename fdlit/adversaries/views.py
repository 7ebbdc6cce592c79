"""What the adversaries read of a round. They sit below the round (fdlit.federation), so they name its
parts by these shapes, which the round's own parts have (``RoundParts``, ``RoundPlan``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from fdlit.methods.base import Aggregator


class PlanView(Protocol):
    """The round's plan: its number, the clients whose upload arrived, its public and test rows."""

    @property
    def round(self) -> int: ...

    @property
    def arrived(self) -> list[int]: ...

    @property
    def public_index(self) -> torch.Tensor | None: ...

    @property
    def eval_rows(self) -> torch.Tensor | None: ...


class ServerView(Protocol):
    """The method's server part, and the set-up broadcast kept with it (where the free-rider's teacher is kept)."""

    @property
    def method(self) -> Aggregator: ...

    @property
    def received(self) -> dict[str, torch.Tensor]: ...


class ClientsView(Protocol):
    """The clients: how many, and their predictions."""

    def __len__(self) -> int: ...

    def predict(self, x: torch.Tensor, ids: Sequence[int] | None = None) -> torch.Tensor: ...


class TensorsView(Protocol):
    """The public inputs and the test set, on the device."""

    @property
    def public_x(self) -> torch.Tensor: ...

    @property
    def test_x(self) -> torch.Tensor: ...

    @property
    def test_y(self) -> torch.Tensor: ...


class PartsView(Protocol):
    """The federation's parts, as the attack metrics read them."""

    @property
    def server(self) -> ServerView: ...

    @property
    def clients(self) -> ClientsView: ...

    @property
    def tensors(self) -> TensorsView: ...

    @property
    def num_classes(self) -> int: ...
