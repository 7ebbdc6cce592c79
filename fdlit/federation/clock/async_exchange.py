"""Asynchronous federated distillation: a teacher from every client's freshest upload, each weighted by
its staleness.

At release k the server holds, for every client i that ever uploaded, its latest upload U_i (its
logits z_i on the public set and whatever else its method's client part sends), made by a model
that had last distilled the teacher of release v_i; its staleness is s_i = k - 1 - v_i and its
factor f_i = f(s_i) (:mod:`fdlit.federation.clock.staleness`, FedAsync's functions, Xie et al.
2019). The method's rule runs on the cached uploads as if they were one round's, giving its
weights W (M' x N over the M' cached clients) and teacher P. Staleness then enters through the
weights: W'[i, x] = W[i, x] f_i / sum_j W[j, x] f_j, and the teacher is the rule's own mixture
under W':

* AVG, entropy weighting, UWA and sUWA (``mixing: probabilities``): P(x) = sum_i W'[i, x] softmax(z_i(x));
* UWA and sUWA with ``mixing: logits``: P(x) = softmax(sum_i W'[i, x] z_i(x));
* ERA (DS-FL): P(x) = softmax(sum_i W'[i, x] softmax(z_i(x)) / T).

When every cached upload has the same factor (in particular f = Constant, or every client equally
stale) W' = W and the rule's teacher is used unchanged, so any public-set rule runs on the cached
rows; a non-constant staleness function with a rule outside the list above is refused at config
time. The teacher goes down only to the clients whose uploads arrived for this release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fdlit.errors import ConfigError
from fdlit.federation.clock.async_parameters import AsyncParameterExchange
from fdlit.federation.clock.staleness import stale_teacher, staleness_weighted
from fdlit.federation.protocols import PredictionExchange, encode_teacher, info_of
from fdlit.messages import Message, as_message

if TYPE_CHECKING:
    from fdlit.federation.clock.clocks import AsynchronousClock, VirtualClock

FIELD = "federation.clock"


def clocked(clock: VirtualClock | None, protocol):
    """The round's exchange under ``clock``: asynchronous rounds cache and age the predictions, or update
    the server's model from the arriving parameters (:mod:`fdlit.federation.clock.async_parameters`)."""
    if clock is None:
        return protocol
    clock.predictions = getattr(protocol, "upload", None) == "predictions"  # inference and distillation take time
    if not clock.asynchronous:
        return protocol
    return AsyncPredictionExchange(clock) if clock.predictions else AsyncParameterExchange(clock)


class AsyncPredictionExchange(PredictionExchange):
    """The prediction exchange of asynchronous rounds: arriving uploads replace their clients' cached
    ones, the teacher is built from the whole cache, sent to the arriving clients, who distil."""

    def __init__(self, clock: AsynchronousClock):
        self.clock = clock

    def receive(self, parts, plan, sent):
        received = super().receive(parts, plan, sent)
        if not received.ids:  # no upload arrived: no teacher, no public phase
            self.clock.last_staleness = []
        return received

    def aggregate(self, parts, plan, received):
        if not received.ids:
            return None, None
        clock, tl, ids = self.clock, self.clock.timeline, received.ids
        for i, upload in zip(ids, received.uploads, strict=True):
            clock.cache[i] = as_message(upload)  # with the metrics its client reported (the rule's diagnostics)
            clock.cached_version[i] = tl.version[i]
        cached = sorted(clock.cache)
        staleness = [plan.round - 1 - clock.cached_version[i] for i in cached]
        clock.last_staleness = staleness
        info = info_of(parts, plan, cached)
        ctx = parts.facts.server_context(plan.round, info)
        result = parts.server.aggregate([clock.cache[i] for i in cached], ctx)
        factors = torch.tensor([clock.staleness(s) for s in staleness], dtype=torch.float64)
        if result.weights is not None and bool((factors != factors[0]).any()):
            z = torch.stack([clock.cache[i]["logits"].float() for i in cached])
            result.weights = staleness_weighted(result.weights.double(), factors).float()
            result.teacher = stale_teacher(parts.server.method, result.weights, z)
        result.stats.update(received.stats)
        teachers = self.send_teacher(parts, plan, ids, result, ctx, info.public_x)
        if len(cached) != len(ids):  # weights are over the cached clients, the round's rows over the arrived
            result.weights = None
        return result, teachers

    @staticmethod
    def send_teacher(parts, plan, ids, result, ctx, public_x):
        """The teacher, encoded as the synchronous exchange sends it, down to the arrived clients."""
        server = parts.server
        keep = result.keep
        teacher = result.teacher if keep is None else result.teacher[keep]
        kept_x = public_x if keep is None else public_x[keep]
        teacher_sent, targets = encode_teacher(teacher, server.message_dtype)
        message = Message({"teacher": teacher_sent} if keep is None else {"teacher": teacher_sent, "keep_mask": keep})
        sent = server.method.configure(message, ids, ctx)
        teachers = []
        for i in ids:
            server.send_down(plan.round, i, sent[i])
            if sent[i] is not message:
                raise ConfigError(FIELD, f"{type(server.method).__name__}.configure sends clients different "
                                  "messages; allowed with AsynchronousClock: one teacher for every arriving client")
            teachers.append((kept_x, targets))
        return teachers
