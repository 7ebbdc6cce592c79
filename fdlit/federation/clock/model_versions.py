"""The server's model versions under asynchronous parameter exchange: which model each client trains
from, so that its delta is taken against it (:mod:`fdlit.federation.clock.async_parameters`)."""

from __future__ import annotations

from typing import Any

import torch


class ModelVersions:
    """The server's model versions: the current version t, the version tau_i each client holds, and the
    models x_tau some client holds (with the current one); saved with the run."""

    def __init__(self):
        self.current = 0
        self.held: dict[int, int] = {}  # client -> the version of the model it trains from
        self.models: dict[int, torch.Tensor] = {}  # version -> flat parameters

    def begin(self, initial: torch.Tensor, num_clients: int) -> None:
        """Before the first update: every client holds the initial model x_0 (the set-up's broadcast)."""
        if not self.models:
            self.models, self.held = {0: initial}, dict.fromkeys(range(num_clients), 0)

    def staleness(self, client: int) -> int:
        return self.current - self.held[client]

    def base(self, client: int) -> torch.Tensor:
        return self.models[self.held[client]]

    def release(self, model: torch.Tensor, clients: list[int]) -> None:
        """x_{t+1} sent to ``clients``; a model no client holds any more is dropped."""
        self.current += 1
        self.models[self.current] = model
        for i in clients:
            self.held[i] = self.current
        kept = {*self.held.values(), self.current}
        self.models = {v: x for v, x in self.models.items() if v in kept}

    def state_dict(self) -> dict[str, Any]:
        return {"current": self.current, "held": {str(i): v for i, v in self.held.items()},
                "models": {str(v): x for v, x in self.models.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.current = int(state["current"])
        self.held = {int(i): int(v) for i, v in state["held"].items()}
        self.models = {int(v): x for v, x in state["models"].items()}
