"""The hooks of a federation run: how run bookkeeping (run directory, W&B, checkpoints, progress)
and user code observe the loop. Methods do not implement these: they have their own client and
server parts (fdlit.methods.base).

Order: on_fit_start -> [method set-up, round 0] -> per round: on_round_start -> [private phase;
public inference; client uploads; aggregation; broadcast; public phase] -> on_round_end -> on_fit_end;
inside each phase, on_clients_progress as clients finish.
"""

from __future__ import annotations

from typing import Any

# ``loop`` is the FederationLoop (not imported here: the loop imports this module)


class FederationCallback:
    """Base class: every hook is a no-op."""

    def on_fit_start(self, loop) -> None:
        pass

    def on_round_start(self, loop, round: int) -> None:
        pass

    def on_clients_progress(self, loop, phase: str, done: float, total: int) -> None:
        """Inside a phase: ``done`` of ``total`` clients have trained (the executor says how often:
        per client, per chunk and epoch, per Ray actor)."""

    def on_round_end(self, loop, round: int, metrics: dict[str, Any]) -> None:
        pass

    def on_fit_end(self, loop, summary: dict[str, Any]) -> None:
        pass
