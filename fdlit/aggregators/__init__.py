"""Aggregation rules: client predictions on the public set -> teacher P (ALGORITHMS.md)."""

from fdlit.aggregators.averaging import ProbabilityAveragingAggregator
from fdlit.aggregators.base import AggregationResult, Aggregator, weight_concentration, weight_entropy
from fdlit.aggregators.density import DiagonalGaussianMixture, mixture_log_likelihood
from fdlit.aggregators.uncertainty import SmoothedUncertaintyWeightedAggregator, UncertaintyWeightedAggregator

__all__ = [
    "AggregationResult",
    "Aggregator",
    "DiagonalGaussianMixture",
    "ProbabilityAveragingAggregator",
    "SmoothedUncertaintyWeightedAggregator",
    "UncertaintyWeightedAggregator",
    "mixture_log_likelihood",
    "weight_concentration",
    "weight_entropy",
]
