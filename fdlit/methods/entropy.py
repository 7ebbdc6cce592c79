"""Entropy weighting (FedHKT-style confidence weighting)."""

from __future__ import annotations

import torch

from fdlit.errors import check_number
from fdlit.methods.base import AggregationResult, Aggregator


class EntropyWeighted(Aggregator):
    """Entropy weighting: W[:, x] = softmax_i( -H(Q_i(x)) / T ),  P(x) = sum_i W[i, x] Q_i(x).

    Source: the "entropy" row of FedGO's (Jang et al. 2025) table of prior weighting rules
    (FedHKT-style); docs/algorithms.md, "Confidence and variance weightings". Upload: N*C numbers per
    client (H is computed on the server from the logits).

    **unclear** (docs/algorithms.md): FedGO's table writes "proportional to exp(entropy)"; fdlit uses
    the *negative* entropy, the sign under which more confident clients weigh more, which is the stated
    intent of the rule. H is in nats, so with T = 1 the weight ratio of two clients is at most
    exp(log C) = C.

    Args:
        temperature: T > 0; smaller T concentrates the weight on the most confident client.
    """

    short_name = "entropy"
    label = "Entropy-weighted"  # how tables and figures name the method

    def __init__(self, temperature: float = 1.0):
        check_number("aggregator.temperature", temperature)
        self.temperature = temperature

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        logq = z.log_softmax(-1)
        q = logq.exp()
        entropy = -(q * logq).sum(-1)  # M x N
        weights = torch.softmax(-entropy / self.temperature, dim=0)
        stats = {"entropy/client_entropy_mean": float(entropy.mean())}
        return AggregationResult(teacher=self.mix(weights, q), weights=weights, stats=stats)
