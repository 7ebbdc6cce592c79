"""Robust parameter averaging: the coordinate-wise median and trimmed mean of the clients'
parameters (FedAvg's family, parameter exchange)."""

from __future__ import annotations

import torch

from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult
from fdlit.methods.fedavg import FedAvg
from fdlit.methods.robust_statistics import coordinate_median, coordinate_trimmed_mean


def _global(statistic: torch.Tensor, coefficients: torch.Tensor) -> AggregationResult:
    """The global model, and each client's share of its coordinates (``clients/model_share``)."""
    shares = coefficients.mean(-1).tolist()
    return AggregationResult(teacher=None, broadcast={"parameters": statistic}, stats={"clients/model_share": shares})


class FedMedian(FedAvg):
    """FedAvg with the coordinate-wise median instead of the mean (Yin, Chen, Ramchandran, Bartlett
    2018, *Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates*, Option I):

        w_{t+1}[p] = med_k w_{t+1}^k[p]   for every parameter coordinate p

    unweighted by n_k, as in Yin et al. The client part and set-up are FedAvg's."""

    short_name = "fedmedian"
    label = "FedMedian"  # how tables and figures name the method
    secure_refusal = "takes a median across the clients of every parameter, an order statistic that needs each client's value"

    def aggregate(self, uploads, ctx):
        return _global(*coordinate_median(torch.stack([u["parameters"] for u in uploads])))


class FedTrimmedMean(FedAvg):
    """FedAvg with the coordinate-wise trimmed mean (Yin et al. 2018, Option II):

        w_{t+1}[p] = 1/(M - 2b) sum_{j = b+1}^{M-b} w_(j)[p],   b = floor(beta * M)

    the b largest and smallest values of every coordinate cut (b at most (M - 1) / 2), unweighted.

    Args:
        beta: the fraction cut from each end, in [0, 0.5).
    """

    short_name = "fedtrimmedmean"
    label = "FedTrimmedMean"  # how tables and figures name the method
    secure_refusal = "cuts the most extreme clients of every parameter before averaging, which needs each client's value"

    def __init__(self, beta: float = 0.2):
        super().__init__()
        if not 0 <= beta < 0.5:
            raise ConfigError("aggregator.beta", f"must be in [0, 0.5), got {beta}")
        self.beta = beta

    def aggregate(self, uploads, ctx):
        return _global(*coordinate_trimmed_mean(torch.stack([u["parameters"] for u in uploads]), self.beta))
