"""Methods: each a server part (an Aggregator: client predictions or parameters -> teacher P or a
global model) and a client part (a ClientPart) (docs/algorithms.md, docs/design.md)."""

from fdlit.aggregators.averaging import ProbabilityAveragingAggregator
from fdlit.aggregators.base import AggregationResult, Aggregator, ClientPart, weight_concentration, weight_entropy
from fdlit.aggregators.entropy import EntropyWeightedAggregator
from fdlit.aggregators.era import EntropyReductionAggregator
from fdlit.aggregators.logit_averaging import LogitAveragingAggregator
from fdlit.aggregators.f2l import F2LAggregator
from fdlit.aggregators.f2l_fedavg import F2LParams
from fdlit.aggregators.fedavg import FedAvg
from fdlit.aggregators.feddf import FedDF
from fdlit.aggregators.fedgo import FedGOAggregator
from fdlit.aggregators.fedgo_fedavg import FedGOParams
from fdlit.aggregators.fedmd import FedMDAggregator
from fdlit.aggregators.fedprox import FedProx
from fdlit.aggregators.krum import Krum
from fdlit.aggregators.kulsif import KuLSIF
from fdlit.aggregators.lkd import LKDAggregator
from fdlit.aggregators.meta_model import MetaModelAggregator
from fdlit.aggregators.oracle import OracleAggregator
from fdlit.aggregators.robust_parameters import FedMedian, FedTrimmedMean
from fdlit.aggregators.robust_predictions import MedianAggregator, TrimmedMeanAggregator
from fdlit.aggregators.scaffold import Scaffold
from fdlit.aggregators.selective import SelectiveFDAggregator
from fdlit.aggregators.variance import LogitVarianceAggregator
from fdlit.aggregators.density import DiagonalGaussianMixture, mixture_log_likelihood
from fdlit.aggregators.uncertainty import SmoothedUncertaintyWeightedAggregator, UncertaintyWeightedAggregator

__all__ = [
    "AggregationResult",
    "Aggregator",
    "ClientPart",
    "DiagonalGaussianMixture",
    "EntropyReductionAggregator",
    "EntropyWeightedAggregator",
    "F2LAggregator",
    "F2LParams",
    "LogitAveragingAggregator",
    "LogitVarianceAggregator",
    "FedAvg",
    "FedDF",
    "FedGOAggregator",
    "FedGOParams",
    "FedMDAggregator",
    "FedMDClient",
    "FedMedian",
    "FedTrimmedMean",
    "FedProx",
    "Krum",
    "KuLSIF",
    "LKDAggregator",
    "MedianAggregator",
    "MetaModelAggregator",
    "OracleAggregator",
    "Scaffold",
    "SelectiveFDAggregator",
    "ProbabilityAveragingAggregator",
    "SmoothedUncertaintyWeightedAggregator",
    "TrimmedMeanAggregator",
    "UncertaintyWeightedAggregator",
    "mixture_log_likelihood",
    "weight_concentration",
    "weight_entropy",
]


def __getattr__(name):
    # FedMDClient is a client module: imported only when it is asked for
    if name == "FedMDClient":
        from fdlit.aggregators.fedmd_client import FedMDClient

        return FedMDClient
    raise AttributeError(name)
