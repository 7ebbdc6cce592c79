"""The hooks of a federation run: how run bookkeeping (run directory, W&B, checkpoints, progress)
and user code observe the loop. Methods do not implement these: they have their own client and
server parts (fdlit.aggregators.base).

Order: on_fit_start -> [method set-up, round 0] -> per round: on_round_start -> [private phase;
public inference; client uploads; aggregation; broadcast; public phase] -> on_round_end -> on_fit_end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fdlit.federation.loop import FederationLoop


class FederationCallback:
    """Base class: every hook is a no-op."""

    def on_fit_start(self, loop: "FederationLoop") -> None:
        pass

    def on_round_start(self, loop: "FederationLoop", round: int) -> None:
        pass

    def on_round_end(self, loop: "FederationLoop", round: int, metrics: dict[str, Any]) -> None:
        pass

    def on_fit_end(self, loop: "FederationLoop", summary: dict[str, Any]) -> None:
        pass
