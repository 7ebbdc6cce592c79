"""The hooks of a federation run: how run bookkeeping (run directory, W&B, checkpoints, progress)
and user code observe the loop. Methods do not implement these: they have their own client and
server parts (fdlit.methods.base).

Order: on_fit_start -> [method set-up, round 0] -> per round: on_round_start -> [private phase;
public inference; client uploads; aggregation; broadcast; public phase] -> on_round_end -> on_fit_end;
inside each phase, on_clients_progress as clients finish.

Every hook is given a :class:`RoundView` of the run, as Lightning hands its callbacks the trainer:
what the run's bookkeeping reads (the round, the metrics so far, the clients, the ledger, the
state a checkpoint saves), never the loop's own steps or settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: the config's --help imports this module before clients load
    from fdlit.clients.client import ClientModule
    from fdlit.data.federated import ClientData
    from fdlit.execution.executor import ClientExecutor
    from fdlit.messages import JSON, Metrics


class LedgerView(Protocol):
    """The communication ledger, read-only: every message counted so far, and as rows for a file."""

    @property
    def messages(self) -> Sequence[object]: ...

    def rows(self, start: int = 0) -> list[dict[str, JSON]]: ...

    def total(self, direction: str | None = None, round: int | None = None, client: int | None = None) -> int: ...


class RoundView(Protocol):
    """What a callback sees of the run (read-only properties; the objects they return are live)."""

    @property
    def round(self) -> int:
        """The last completed round (0 before round 1)."""

    @property
    def rounds(self) -> int:
        """The rounds the run is configured for."""

    @property
    def history(self) -> Sequence[Metrics]:
        """Every completed round's metrics, in order."""

    @property
    def clients(self) -> Sequence[ClientModule]:
        """The clients, on the driver (a remote executor's are fetched by :meth:`state_dict` and at the end)."""

    @property
    def client_data(self) -> Sequence[ClientData]:
        """Each client's data (its classes, its private split)."""

    @property
    def executor(self) -> ClientExecutor:
        """Where the clients live."""

    @property
    def ledger(self) -> LedgerView:
        """Every message counted so far."""

    def summary(self) -> Metrics:
        """The run's best and final numbers so far."""

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (what a checkpoint saves)."""


class FederationCallback:
    """Base class: every hook is a no-op."""

    def on_fit_start(self, view: RoundView) -> None:
        pass

    def on_round_start(self, view: RoundView, round: int) -> None:
        pass

    def on_clients_progress(self, view: RoundView, phase: str, done: float, total: int) -> None:
        """Inside a phase: ``done`` of ``total`` clients have trained (the executor says how often:
        per client, per chunk and epoch, per Ray actor)."""

    def on_round_end(self, view: RoundView, round: int, metrics: Metrics) -> None:
        pass

    def on_fit_end(self, view: RoundView, summary: Metrics) -> None:
        pass
