from fdlit.callbacks import FederationCallback
from fdlit.federation.communication import CommunicationLedger
from fdlit.federation.executor import ClientExecutor, SequentialExecutor
from fdlit.federation.ray_executor import RayExecutor
from fdlit.federation.vectorized import VectorizedExecutor, select_executor
from fdlit.federation.loop import FederationLoop, NumericalFault, build_model, format_summary

__all__ = [
    "ClientExecutor",
    "CommunicationLedger",
    "FederationCallback",
    "FederationLoop",
    "NumericalFault",
    "RayExecutor",
    "SequentialExecutor",
    "VectorizedExecutor",
    "build_model",
    "format_summary",
    "select_executor",
]
