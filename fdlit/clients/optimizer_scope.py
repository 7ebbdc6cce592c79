"""How long a client's optimizer state lives (``client.optimizer_scope``).

* ``shared``: one optimizer across the private and the public phase and across rounds (fdlit's default);
* ``per_phase``: one optimizer per phase, each kept across rounds (the SCARLET authors' code: an SGD for
  the private phase and another for distillation, both saved with the client);
* ``per_round``: one optimizer for both phases of a round, its state cleared when a round's private
  phase starts (a fresh optimizer each round).

The client keeps one ``torch.optim`` optimizer object (every executor holds that one: Fabric's wrapper,
the vectorized executor's stacked update); a scope other than ``shared`` swaps or clears its *state*
(``state_dict`` / ``load_state_dict``) when the phase changes, keeping the learning rates of the moment.
"""

from __future__ import annotations

import copy

import torch

SCOPES = ("shared", "per_phase", "per_round")


class OptimizerScope:
    """The optimizer state of the phases not running (``per_phase``), and which phase owns the live state."""

    def __init__(self, scope: str):
        self.scope = scope
        self.live_phase: str | None = None
        self.stashed: dict[str, dict] = {}

    def enter(self, optimizer: torch.optim.Optimizer, phase: str) -> None:
        """Before ``phase`` trains: give ``optimizer`` the state the scope says it has."""
        if self.scope == "per_round":
            if phase == "private":
                optimizer.state.clear()
        elif self.scope == "per_phase" and self.live_phase not in (None, phase):
            lrs = [group["lr"] for group in optimizer.param_groups]
            self.stashed[self.live_phase] = copy.deepcopy(optimizer.state_dict())
            if phase in self.stashed:
                optimizer.load_state_dict(self.stashed.pop(phase))
            else:
                optimizer.state.clear()
            for group, lr in zip(optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
        self.live_phase = phase

    def state_dict(self) -> dict:
        return {"live_phase": self.live_phase, "stashed": self.stashed}

    def load_state_dict(self, state: dict) -> None:
        self.live_phase, self.stashed = state["live_phase"], dict(state["stashed"])
