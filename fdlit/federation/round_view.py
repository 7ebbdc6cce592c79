"""The loop as its callbacks see it: :class:`fdlit.callbacks.RoundView`, read-only. The loop has every
member of the view itself; this proxy hands callbacks those members and nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fdlit.callbacks import LedgerView, RoundView
    from fdlit.clients.client import ClientModule
    from fdlit.data.federated import ClientData
    from fdlit.execution.executor import ClientExecutor
    from fdlit.records import Metrics


class LoopView:
    """The :class:`~fdlit.callbacks.RoundView` of ``loop`` (the FederationLoop): its members, nothing else."""

    __slots__ = ("_loop",)

    def __init__(self, loop: RoundView):
        self._loop = loop

    @property
    def round(self) -> int:
        return self._loop.round

    @property
    def rounds(self) -> int:
        return self._loop.rounds

    @property
    def history(self) -> Sequence[Metrics]:
        return tuple(self._loop.history)

    @property
    def clients(self) -> Sequence[ClientModule]:
        return tuple(self._loop.clients)

    @property
    def client_data(self) -> Sequence[ClientData]:
        return tuple(self._loop.client_data)

    @property
    def executor(self) -> ClientExecutor:
        return self._loop.executor

    @property
    def ledger(self) -> LedgerView:
        return self._loop.ledger

    def summary(self) -> Metrics:
        return self._loop.summary()

    def state_dict(self) -> dict[str, Any]:
        return self._loop.state_dict()
