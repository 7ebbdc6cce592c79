"""Methods: each a server part (an Aggregator: client predictions or parameters -> teacher P or a
global model) and a client part (a ClientPart) (docs/algorithms.md, docs/design.md)."""

from fdlit.methods.averaging import ProbabilityAveraging
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart, weight_concentration, weight_entropy
from fdlit.methods.cfd import CFD
from fdlit.methods.comet import COMET
from fdlit.methods.density import DiagonalGaussianMixture, mixture_log_likelihood
from fdlit.methods.edgefd import EdgeFD
from fdlit.methods.entropy import EntropyWeighted
from fdlit.methods.era import EntropyReduction
from fdlit.methods.f2l import F2L
from fdlit.methods.f2l_fedavg import F2LParams
from fdlit.methods.fd import FedDistill
from fdlit.methods.fedavg import FedAvg
from fdlit.methods.feddf import FedDF
from fdlit.methods.fedema_distill import FedEMADistill
from fdlit.methods.fedgen import FedGen
from fdlit.methods.fedgh import FedGH
from fdlit.methods.fedgo import FedGO
from fdlit.methods.fedgo_fedavg import FedGOParams
from fdlit.methods.fedkd import FedKD
from fdlit.methods.fedmd import FedMD
from fdlit.methods.fedproto import FedProto
from fdlit.methods.fedprox import FedProx
from fdlit.methods.fedtgp import FedTGP
from fdlit.methods.fml import FML
from fdlit.methods.krum import Krum
from fdlit.methods.kulsif import KuLSIF
from fdlit.methods.lg_fedavg import LGFedAvg
from fdlit.methods.lkd import LKD
from fdlit.methods.logit_averaging import LogitAveraging
from fdlit.methods.meta_model import MetaModel
from fdlit.methods.oracle import Oracle
from fdlit.methods.robust_parameters import FedMedian, FedTrimmedMean
from fdlit.methods.robust_predictions import CoordinateMedian, TrimmedMean
from fdlit.methods.scaffold import Scaffold
from fdlit.methods.scarlet import SCARLET
from fdlit.methods.selective import SelectiveFD
from fdlit.methods.uncertainty import SmoothedUncertaintyWeighted, UncertaintyWeighted
from fdlit.methods.variance import LogitVariance

__all__ = [
    "AggregationResult",
    "CFD",
    "COMET",
    "Aggregator",
    "ClientPart",
    "CoordinateMedian",
    "DiagonalGaussianMixture",
    "EdgeFD",
    "EntropyReduction",
    "EntropyWeighted",
    "F2L",
    "F2LParams",
    "FML",
    "FedDistill",
    "LogitAveraging",
    "LogitVariance",
    "FedAvg",
    "FedDF",
    "FedEMADistill",
    "FedGen",
    "FedGH",
    "FedGO",
    "FedGOParams",
    "FedKD",
    "FedMD",
    "FedMedian",
    "FedTrimmedMean",
    "FedProx",
    "FedProto",
    "FedTGP",
    "Krum",
    "KuLSIF",
    "LGFedAvg",
    "LKD",
    "MetaModel",
    "Oracle",
    "Scaffold",
    "SCARLET",
    "SelectiveFD",
    "ProbabilityAveraging",
    "SmoothedUncertaintyWeighted",
    "TrimmedMean",
    "UncertaintyWeighted",
    "mixture_log_likelihood",
    "weight_concentration",
    "weight_entropy",
]

