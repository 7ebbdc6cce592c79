"""Rounds on a virtual clock: the clients' devices, synchronous rounds with a deadline, asynchronous
federated distillation with staleness-weighted cached predictions, FedBuff and FedAsync for parameter
exchange (docs/async.md)."""

from fdlit.federation.clock.clocks import AsynchronousClock, SynchronousClock, VirtualClock
from fdlit.federation.clock.profiles import DeviceProfile, LogNormalProfile, TraceProfile, UniformProfile
from fdlit.federation.clock.server_updates import FedAsync, FedBuff, ServerUpdate
from fdlit.federation.clock.staleness import Constant, Hinge, Polynomial, Staleness

__all__ = ["AsynchronousClock", "Constant", "DeviceProfile", "FedAsync", "FedBuff", "Hinge", "LogNormalProfile",
           "Polynomial", "ServerUpdate", "Staleness", "SynchronousClock", "TraceProfile", "UniformProfile",
           "VirtualClock"]
