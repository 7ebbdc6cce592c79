"""Coordinate-wise robust statistics over clients, shared by the robust rules of predictions
(:mod:`fdlit.methods.robust_predictions`) and of parameters
(:mod:`fdlit.methods.robust_parameters`).

Each returns the statistic of X (M x ...) over its first dimension and the coefficients A (M x ...,
summing to 1 over clients) with statistic = sum_i A_i X_i coordinate by coordinate: A says how much of
each coordinate came from which client, which the rules turn into per-client weights.
"""

from __future__ import annotations

import torch


def _from_sorted(x: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean of the order statistics lo..hi-1 of x over dim 0, and its coefficients."""
    ordered, index = x.sort(dim=0)
    kept = hi - lo
    value = ordered[lo:hi].mean(0)
    coefficients = torch.zeros_like(x).scatter_(0, index[lo:hi], 1.0 / kept)
    return value, coefficients


def coordinate_median(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The coordinate-wise median (the mean of the two middle values for an even M)."""
    m = x.shape[0]
    return _from_sorted(x, (m - 1) // 2, m // 2 + 1)


def trimmed_count(m: int, beta: float) -> int:
    """b = floor(beta * M) values cut from each end, at most (M - 1) // 2 so that one is left."""
    return min(int(beta * m), (m - 1) // 2)


def coordinate_trimmed_mean(x: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The coordinate-wise beta-trimmed mean: the b = floor(beta * M) largest and smallest values of
    every coordinate removed, the remaining M - 2b averaged."""
    m = x.shape[0]
    b = trimmed_count(m, beta)
    return _from_sorted(x, b, m - b)
