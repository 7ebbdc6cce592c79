"""The hooks of a federation run. Aggregators, loggers and user callbacks all implement these.

Order within one round (000 Algorithm 1):
  on_round_start -> [private phase; public inference; on_client_private_end per client]
  -> aggregate (aggregator only) -> [broadcast; public phase] -> on_round_end
Whatever ``on_client_private_end`` returns is uploaded by that client and counted in the bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:  # pragma: no cover
    from fdlit.clients import ClientModule
    from fdlit.data import ClientData
    from fdlit.federation.loop import FederationLoop


class FederationCallback:
    """Base class: every hook is a no-op."""

    def on_fit_start(self, loop: "FederationLoop") -> None:
        pass

    def on_round_start(self, loop: "FederationLoop", round: int) -> None:
        pass

    def on_client_private_end(
        self,
        loop: "FederationLoop",
        client: "ClientModule",
        data: "ClientData",
        public_logits: torch.Tensor,
    ) -> Optional[dict[str, torch.Tensor]]:
        """Runs on the client after its private phase and public inference.

        Return tensors the client uploads besides its public logits (e.g. density-model parameters).
        Keys starting with ``_`` are local diagnostics handed to the aggregator in-process: they are
        not part of the protocol and are not counted as sent.
        """
        return None

    def on_round_end(self, loop: "FederationLoop", round: int, metrics: dict[str, Any]) -> None:
        pass

    def on_fit_end(self, loop: "FederationLoop", summary: dict[str, Any]) -> None:
        pass
