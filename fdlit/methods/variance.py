"""Logit-variance weighting (Fed-ET-style)."""

from __future__ import annotations

import torch

from fdlit.errors import check_number
from fdlit.methods.base import AggregationResult, Aggregator


class LogitVariance(Aggregator):
    """Logit-variance weighting: W[i, x] = Var_c z_i(x)_c / sum_j Var_c z_j(x)_c,  P = sum_i W[i] Q_i.

    Source: the "logit variance" row of FedGO's (Jang et al. 2025) table of prior weighting rules
    (Fed-ET, Cho et al. 2022); docs/algorithms.md, "Confidence and variance weightings". A client whose
    logits spread out over the classes is taken as confident. Upload: N*C numbers per client.

    **choice**: the variance is the population variance over the C classes (unbiased=False); a sample
    on which every client has zero variance (constant logits) gets uniform weights, and ``eps`` is
    added to every variance so a single client with constant logits never gets exactly zero weight
    unless everyone does.

    Args:
        eps: >= 0, added to every client's variance before normalising.
    """

    short_name = "logitvar"
    label = "Logit-variance-weighted"  # how tables and figures name the method

    def __init__(self, eps: float = 1e-8):
        check_number("aggregator.eps", eps, inclusive=True)
        self.eps = eps

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        var = z.var(-1, unbiased=False) + self.eps  # M x N
        total = var.sum(0, keepdim=True)
        uniform = torch.full_like(var, 1.0 / var.shape[0])
        weights = torch.where(total > 0, var / total.clamp_min(1e-30), uniform)
        return AggregationResult(teacher=self.mix(weights, z.softmax(-1)), weights=weights)
