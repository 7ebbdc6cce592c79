"""The loop as its callbacks see it: :class:`fdlit.callbacks.RoundView`, read-only: the run's own
state and what its parts hold (the clients' side, the server's ledger), nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fdlit.callbacks import LedgerView
    from fdlit.clients.client import ClientModule
    from fdlit.data.federated import ClientData
    from fdlit.execution.executor import ClientExecutor
    from fdlit.federation.round_parts import RoundParts
    from fdlit.federation.server_side import ServerSide
    from fdlit.federation.settings import FederationSettings
    from fdlit.messages import Metrics


class Run(Protocol):
    """What the view reads of the run (the FederationLoop): its own state, its parts, its summary."""

    round: int
    history: list[Metrics]
    settings: FederationSettings
    server_side: ServerSide
    parts: RoundParts | None

    def summary(self) -> Metrics: ...

    def state_dict(self) -> dict[str, Any]: ...


class LoopView:
    """The :class:`~fdlit.callbacks.RoundView` of ``loop`` (the FederationLoop): its members, nothing else."""

    __slots__ = ("_loop",)

    def __init__(self, loop: Run):
        self._loop = loop

    @property
    def round(self) -> int:
        return self._loop.round

    @property
    def rounds(self) -> int:
        return self._loop.settings.rounds

    @property
    def history(self) -> Sequence[Metrics]:
        return tuple(self._loop.history)

    @property
    def clients(self) -> Sequence[ClientModule]:
        return tuple(self._loop.parts.clients.clients)

    @property
    def client_data(self) -> Sequence[ClientData]:
        return tuple(self._loop.parts.clients.client_data)

    @property
    def executor(self) -> ClientExecutor:
        return self._loop.settings.executor

    @property
    def ledger(self) -> LedgerView:
        return self._loop.server_side.ledger

    def summary(self) -> Metrics:
        return self._loop.summary()

    def state_dict(self) -> dict[str, Any]:
        return self._loop.state_dict()
