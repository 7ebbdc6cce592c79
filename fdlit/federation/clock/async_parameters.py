"""Asynchronous parameter exchange (FedAvg's family under an AsynchronousClock): FedBuff or FedAsync.

The clock decides which uploads arrive for a release (its ``buffer`` or ``period``); the server
updates its model from them with the clock's ``server_update``
(:mod:`fdlit.federation.clock.server_updates`: FedBuff's staleness-scaled deltas, FedAsync's mixing)
and sends the new model only to the clients whose uploads arrived: they load it and start their
next job from it, while the others go on training from the model they last received.

The server therefore keeps, besides its current model x_t (``ServerSide.received``), each client's
base version tau_i and the models x_tau some client still trains from (:class:`ModelVersions`): a
delta is taken against the model its client started from. Both are saved with the run. A release
empties its buffer, so no buffered upload is ever pending at a checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fdlit.errors import ConfigError
from fdlit.federation.protocols import ParameterExchange, info_of
from fdlit.messages import Message, as_message
from fdlit.methods.base import AggregationResult

if TYPE_CHECKING:
    from fdlit.federation.clock.clocks import AsynchronousClock

FIELD = "federation.clock"


class ModelVersions:
    """The server's model versions: the current version t, the version tau_i each client holds, and the
    models x_tau some client holds (with the current one); saved with the run."""

    def __init__(self):
        self.current = 0
        self.held: dict[int, int] = {}  # client -> the version of the model it trains from
        self.models: dict[int, torch.Tensor] = {}  # version -> flat parameters

    def begin(self, initial: torch.Tensor, num_clients: int) -> None:
        """Before the first update: every client holds the initial model x_0 (the set-up's broadcast)."""
        if not self.models:
            self.models, self.held = {0: initial}, dict.fromkeys(range(num_clients), 0)

    def staleness(self, client: int) -> int:
        return self.current - self.held[client]

    def base(self, client: int) -> torch.Tensor:
        return self.models[self.held[client]]

    def release(self, model: torch.Tensor, clients: list[int]) -> None:
        """x_{t+1} sent to ``clients``; a model no client holds any more is dropped."""
        self.current += 1
        self.models[self.current] = model
        for i in clients:
            self.held[i] = self.current
        kept = {*self.held.values(), self.current}
        self.models = {v: x for v, x in self.models.items() if v in kept}

    def state_dict(self) -> dict[str, Any]:
        return {"current": self.current, "held": {str(i): v for i, v in self.held.items()},
                "models": {str(v): x for v, x in self.models.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.current = int(state["current"])
        self.held = {int(i): int(v) for i, v in state["held"].items()}
        self.models = {int(v): x for v, x in state["models"].items()}


class AsyncParameterExchange(ParameterExchange):
    """The parameter exchange of asynchronous rounds: the arriving uploads update the server's model
    (the clock's ``server_update``), which goes down only to the arrived clients."""

    def __init__(self, clock: AsynchronousClock):
        self.clock = clock

    def aggregate(self, parts, plan, received):
        clock, server = self.clock, parts.server
        if not received.ids:  # nothing arrived in this period: the model stays
            clock.last_staleness = []
            return None, None
        ids, versions = received.ids, clock.versions
        current = server.received["parameters"]
        versions.begin(current, len(parts.clients))
        staleness = [versions.staleness(i) for i in ids]
        clock.last_staleness = staleness
        ctx = parts.facts.server_context(plan.round, info_of(parts, plan, ids, public=False))
        results: list[AggregationResult] = []

        def rule(vectors: list[torch.Tensor]) -> torch.Tensor:  # the method's aggregation, its stats kept
            results.append(server.aggregate([Message({"parameters": v}) for v in vectors], ctx))
            return results[-1].broadcast["parameters"]

        model = clock.server_update.step(current, [as_message(u)["parameters"] for u in received.uploads],
                                         [versions.base(i) for i in ids], staleness,
                                         [clock.staleness(s) for s in staleness], rule)
        result = results[-1] if results else AggregationResult(None)
        result.broadcast = {"parameters": model}
        result.stats.update(received.stats)
        message = Message(result.broadcast)
        sent = server.method.configure(message, list(ids), ctx)
        for i in ids:
            if sent[i] is not message:
                raise ConfigError(FIELD, f"{type(server.method).__name__}.configure sends clients different "
                                  "messages; allowed with AsynchronousClock: one model for every arriving client")
            server.send_down(plan.round, i, message)
        server.refresh(message)
        versions.release(model, list(ids))
        return result, {i: message for i in ids}
