"""The round: the federation loop (Kovalchuk et al. 2026, Algorithm 1), its communication ledger,
baselines (local-only, reference) and diagnostics."""

from fdlit.callbacks import FederationCallback
from fdlit.federation.communication import CommunicationLedger
from fdlit.federation.loop import FederationLoop
from fdlit.federation.measurement import NumericalFault
from fdlit.federation.summary_text import format_summary
from fdlit.models.build import build_model

__all__ = ["CommunicationLedger", "FederationCallback", "FederationLoop", "NumericalFault", "build_model",
           "format_summary"]
