"""What every aggregation rule shares: the result type, the interface, weight diagnostics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from fdlit.callbacks import FederationCallback


@dataclass
class AggregationResult:
    """Teacher P (N x C probabilities); per-client weights W (M x N, columns sum to 1) where the rule
    has them; a keep-mask over public samples (N, bool) where the rule drops samples; rule stats."""

    teacher: torch.Tensor
    weights: Optional[torch.Tensor] = None
    keep: Optional[torch.Tensor] = None
    stats: dict[str, float] = field(default_factory=dict)


class Aggregator(FederationCallback):
    """An aggregation rule. Client-side work goes in the client hooks (their return values are
    uploaded and counted); server-side work goes in :meth:`aggregate`.

    ``uploads[i]`` is what client i sent this round: always ``"logits"`` (N x C, the logits on the
    public set, in the dtype they were sent), plus whatever the rule's ``on_client_private_end``
    returned. The server turns logits into probabilities itself, so Q = softmax(logits) costs the
    same N*C numbers on the wire as sending Q.
    """

    def aggregate(self, uploads: list[dict[str, torch.Tensor]]) -> AggregationResult:
        raise NotImplementedError

    @staticmethod
    def stack_logits(uploads: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        return torch.stack([u["logits"].float() for u in uploads])  # M x N x C

    @staticmethod
    def mix(weights: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """P[x] = sum_i W[i, x] Q[i, x] (probability mixing, 000 Definition 3.1)."""
        return torch.einsum("mn,mnc->nc", weights, probs)


def uniform_weights(m: int, n: int, device=None) -> torch.Tensor:
    """W = 1/M for every client and public sample (rules that trust every client equally)."""
    return torch.full((m, n), 1.0 / m, device=device)


def weight_concentration(weights: torch.Tensor) -> torch.Tensor:
    """chi = E_x sum_i W[i,x]^2 in [1/M, 1] (000 Sec. 4, Lemma 4.1). AVG has chi = 1/M exactly."""
    return weights.pow(2).sum(0).mean()


def weight_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean over public samples of the entropy of the client weights (log M for uniform weights)."""
    return -(weights * torch.log(weights.clamp_min(1e-30))).sum(0).mean()
