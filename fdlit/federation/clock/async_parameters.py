"""Asynchronous parameter exchange (FedAvg's family under an AsynchronousClock): FedBuff or FedAsync.

The clock decides which uploads arrive for a release (its ``buffer`` or ``period``); the server
updates its model from them with the clock's ``server_update``
(:mod:`fdlit.federation.clock.server_updates`: FedBuff's staleness-scaled deltas, FedAsync's mixing)
and sends the new model only to the clients whose uploads arrived: they load it and start their
next job from it, while the others go on training from the model they last received.

The server therefore keeps, besides its current model x_t (``ServerSide.received``), each client's
base version tau_i and the models x_tau some client still trains from (:class:`~fdlit.federation.clock.model_versions.ModelVersions`): a
delta is taken against the model its client started from. Both are saved with the run. A release
empties its buffer, so no buffered upload is ever pending at a checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fdlit.errors import ConfigError
from fdlit.federation.protocols import ParameterExchange, info_of
from fdlit.messages import Message, as_message
from fdlit.methods.base import AggregationResult

if TYPE_CHECKING:
    from fdlit.federation.clock.clocks import AsynchronousClock

FIELD = "federation.clock"


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
