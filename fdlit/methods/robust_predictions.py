"""Robust teachers: the coordinate-wise median and trimmed mean of the clients' probabilities."""

from __future__ import annotations

from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult, Aggregator
from fdlit.methods.robust_statistics import coordinate_median, coordinate_trimmed_mean


def _teacher(statistic, coefficients) -> AggregationResult:
    """Renormalised per public sample; W[i, x] = (1/C) sum_c A[i, x, c], client i's share of the
    sample's coordinates (columns sum to 1), so chi and the who-to-trust matrix are logged."""
    teacher = statistic.clamp_min(0)
    teacher = teacher / teacher.sum(-1, keepdim=True).clamp_min(1e-12)
    return AggregationResult(teacher=teacher, weights=coefficients.mean(-1))


class CoordinateMedian(Aggregator):
    """The coordinate-wise median teacher (Yin, Chen, Ramchandran, Bartlett 2018, *Byzantine-Robust
    Distributed Learning: Towards Optimal Statistical Rates*, the coordinate-wise median, applied to
    predictions instead of gradients):

        P(x)_c = med_i Q[i, x, c] / sum_c' med_i Q[i, x, c']

    (the mean of the two middle values for an even M). Fewer than half the clients cannot move a
    coordinate beyond the honest values' range, whatever they upload; with identical uploads it
    equals AVG. Upload: N*C numbers (the public logits), as AVG.
    """

    short_name = "median"
    label = "Median"  # how tables and figures name the method
    secure_refusal = "takes a median across the clients of every entry, an order statistic that needs each client's value"

    def aggregate(self, uploads, ctx):
        return _teacher(*coordinate_median(self.stack_logits(uploads).softmax(-1)))


class TrimmedMean(Aggregator):
    """The coordinate-wise trimmed-mean teacher (Yin et al. 2018, the coordinate-wise trimmed mean,
    applied to predictions):

        P(x)_c ∝ 1/(M - 2b) sum_{j = b+1}^{M-b} Q_(j)[x, c],   b = floor(beta * M)

    where Q_(j) are the clients' values of the coordinate in increasing order: the b largest and b
    smallest are cut (b is at most (M - 1) / 2). beta = 0 is AVG. Upload: N*C numbers.

    Args:
        beta: the fraction cut from each end, in [0, 0.5) (at least the expected fraction of attackers).
    """

    short_name = "trimmed_mean"
    label = "Trimmed mean"  # how tables and figures name the method
    secure_refusal = ("cuts the most extreme clients of every entry before averaging, which needs each client's "
                      "value")

    def __init__(self, beta: float = 0.2):
        if not 0 <= beta < 0.5:
            raise ConfigError("aggregator.beta", f"must be in [0, 0.5), got {beta}")
        self.beta = beta

    def aggregate(self, uploads, ctx):
        return _teacher(*coordinate_trimmed_mean(self.stack_logits(uploads).softmax(-1), self.beta))
