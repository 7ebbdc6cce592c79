"""Protocols: what is exchanged after the private phase, as client steps and server steps.

A protocol names what the round's client step uploads (``upload``) and gives the round
(:mod:`fdlit.federation.round`) three steps in Algorithm 1's order: ``receive`` (server: the uploads
that arrived, counted by the ledger and through the privacy layer's server step), ``aggregate``
(server: the method's server part, what goes down to whom) and ``distil`` (where the clients live:
the public phase, or loading the global model), then ``evaluate``. Client steps run through the
executor (fdlit.execution.steps), so clients that live elsewhere do each in one exchange; every
message up or down goes through the communication ledger once. The loop picks the protocol once,
from the mode and the method, and never branches on it:

* :class:`PredictionExchange` (federated distillation, Kovalchuk et al. 2026, Algorithm 1, lines
  5-15): public inference and the method's upload -> aggregation into a teacher -> the teacher
  down -> the public (distillation) phase;
* :class:`ParameterExchange` (FedAvg and its relatives): parameters up -> the global model down to
  every client; no public phase;
* :class:`NoExchange` (the local-only and reference baselines): nothing is sent.

A method's ``exchange`` (``"predictions"`` or ``"parameters"``) chooses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from fdlit.errors import ConfigError
from fdlit.federation.evaluation import Accuracies
from fdlit.federation.measurement import check_finite
from fdlit.federation.round_facts import RoundPlan
from fdlit.federation.round_parts import RoundParts
from fdlit.messages import Message
from fdlit.methods.base import AggregationResult, Aggregator, FederationInfo
from fdlit.privacy.receive import UploadRound
from fdlit.privacy.secure_upload import SecureSums


def encode_teacher(teacher: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """What goes down the wire for the teacher, and the targets clients rebuild from it. One-hot
    rows (hard labels, e.g. Selective-FD ``labels: hard``) travel as class ids (uint8, int16 above
    256 classes), losslessly; anything else as N x C numbers in the message dtype."""
    c = teacher.shape[-1]
    if len(teacher) and c > 1 and bool(((teacher == 0) | (teacher == 1)).all()) and bool((teacher.sum(-1) == 1).all()):
        ids = teacher.argmax(-1).to(torch.uint8 if c <= 256 else torch.int16)
        return ids, torch.nn.functional.one_hot(ids.long(), c).float()
    sent = teacher.to(dtype)
    return sent, sent.float()


def received_teacher(message: Message, public_x: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a client distils from, rebuilt from the message it was sent: the kept public inputs and
    the teacher's targets (class ids travel as ids: see :func:`encode_teacher`)."""
    kind = "server_teacher" if "server_teacher" in message else "teacher"
    sent, keep = message[kind], message.get("keep_mask")
    targets = sent.float() if sent.is_floating_point() else torch.nn.functional.one_hot(sent.long(), num_classes).float()
    return (public_x if keep is None else public_x[keep]), targets


class Protocol:
    """One round's exchange after the private phase, and the method's one-off set-up before round 1.

    A protocol is part of fdlit's round, not of a method: its steps get the federation's parts
    (:class:`~fdlit.federation.round_parts.RoundParts`: the clients' side, the server's side, the
    round's facts) and hand the method only its contexts.

    A round's exchange is three steps the round (fdlit.federation.round) calls in Algorithm 1's order:
    ``receive`` (what each client sent in the round's client step, by client id: counted, decoded,
    the privacy layer's server step), ``aggregate`` (the method's server part: a teacher or a global
    model, and what goes down), ``distil`` (each client takes what it was sent: the public phase, or
    loading the global model); ``evaluate`` is how every client is measured after the exchange."""

    communicates = True  # False: the baselines, which send nothing (set-up, DP and budget included)
    upload: str | None = None  # what the round's client step sends after the private phase (ClientStep.upload)

    def upload_info(self, parts: RoundParts, plan: RoundPlan) -> FederationInfo | None:
        """What the uploading clients (``plan.arrived``) know in their upload step."""
        return info_of(parts, plan, list(plan.arrived)) if self.upload else None

    # ------------------------------------------------------------------ round 0
    def setup(self, parts: RoundParts) -> None:
        """Before round 1: the method's public warm-up and its set-up exchange, if it has them."""
        self.public_warmup(parts)
        if parts.server.method.has_setup:
            self.method_setup(parts)

    def public_warmup(self, parts: RoundParts) -> None:
        """For methods that ask (``public_warmup_epochs`` > 0, e.g. FedMD's transfer learning): every
        client trains on the labelled public set with the private loss. The public set is known to
        every party, so nothing is sent."""
        epochs = int(parts.server.method.public_warmup_epochs or 0)
        if epochs > 0:
            t = parts.tensors
            losses = parts.clients.train(range(len(parts.clients)), "private", [(t.public_x, t.public_y)] *
                                         len(parts.clients), epochs, parts.batch_size)
            check_finite(losses, 0, "public warm-up")

    def method_setup(self, parts: RoundParts) -> None:
        """Round 0: the method's one-off client work where the clients live, the server's set-up,
        and its broadcast; every message is counted as round 0."""
        server, info = parts.server, parts.facts.info(0)
        raw = parts.clients.setup_step(info)
        uploads = [server.send_up(0, i, payload) for i, payload in enumerate(raw)]
        broadcast = server.method.server_setup(uploads, parts.facts.server_context(0)) or {}
        for i in range(len(parts.clients)):
            server.send_down(0, i, broadcast)
        server.received = dict(broadcast)
        if parts.clients.method_part.has_receive:  # e.g. parameter exchange: every client starts from the server's model
            parts.clients.receive_step(info, server.received)

    def stop_reason(self, parts: RoundParts, r: int) -> str | None:
        """Why the run stops before round r (the privacy budget is spent), or None."""
        return parts.server.privacy.over_budget(r, parts.facts.sample_rate)

    # ------------------------------------------------------------------ a round
    def receive(self, parts: RoundParts, plan: RoundPlan, sent: dict[int, Message]) -> Received:
        """Server step (end of Stage 1): the uploads that arrived, as the server's rule receives them."""
        raise NotImplementedError

    def aggregate(self, parts: RoundParts, plan: RoundPlan, received: Received
                  ) -> tuple[AggregationResult | None, object | None]:
        """Server step (Stage 2): the method's result and what goes down (None: nothing)."""
        raise NotImplementedError

    def distil(self, parts: RoundParts, plan: RoundPlan, received: Received, down: object | None) -> list[float]:
        """Client step (Stage 2): each client takes what it was sent; the public phase's losses."""
        raise NotImplementedError

    def evaluate(self, parts: RoundParts, plan: RoundPlan, after_private: Accuracies | None
                 ) -> Callable[[], Accuracies | None]:
        """How every client is measured after the exchange (None when the round does not evaluate); the
        round calls it once the executor has the clients' state after the exchange (steps.when_evaluated);
        the clients the exchange did not reach keep their accuracies from after the private phase."""
        return partial(parts.evaluated_again, plan, after_private, parts.clients.changed())


@dataclass(frozen=True)
class Received:
    """What the server received in a round: the clients whose uploads arrived (``ids``), the uploads as
    the method's rule receives them (None: nothing to aggregate, e.g. too few survived to unmask) and
    the privacy layer's stats of the round."""

    ids: list[int]
    uploads: list | SecureSums | None
    stats: dict[str, float]


def nothing() -> Received:
    """No upload to aggregate."""
    return Received([], None, {})


def info_of(parts: RoundParts, plan: RoundPlan, ids: list[int], public: bool = True) -> FederationInfo:
    """What the clients ``ids`` and the server know in this round (``public``: with the round's public subset)."""
    everyone = len(ids) == len(parts.clients)
    return parts.facts.info(plan.round, () if everyone else tuple(ids), plan.public_index if public else None)


def arrived(parts: RoundParts, plan: RoundPlan, sent: dict[int, Message]) -> tuple[list[int], list[Message]]:
    """The clients whose upload arrived, and their messages: a node lost during the client step (a
    deployment) leaves its clients out, as dropouts of this round."""
    lost = parts.clients.unreachable()
    ids = [i for i in plan.arrived if i in sent and i not in lost]
    return ids, [sent[i] for i in ids]


class PredictionExchange(Protocol):
    """Federated distillation: predictions up, a teacher down, then the public phase."""

    upload = "predictions"

    def receive(self, parts, plan, sent):
        ids, messages = arrived(parts, plan, sent)
        if not ids:  # no upload arrived: no teacher, no public phase
            return nothing()
        uploads, privacy_stats = self.receive_uploads(parts, plan.round, ids, messages, info_of(parts, plan, ids),
                                                      plan.sampled)
        return Received(ids, uploads, privacy_stats)

    def aggregate(self, parts, plan, received):
        if not received.ids:
            return None, None
        if received.uploads is None:  # too few survived to unmask: no teacher, and the round records why (secagg/*)
            return AggregationResult(None, stats=received.stats), None
        info = info_of(parts, plan, received.ids)  # the clients whose uploads arrived
        result, teachers = self.server_aggregate(parts, plan, received.ids, received.uploads, info)
        result.stats.update(received.stats)
        return result, teachers

    def distil(self, parts, plan, received, down):
        if down is None:
            return [math.nan]
        return self.client_distil(parts, plan, received.ids, down)

    @staticmethod
    def receive_uploads(parts: RoundParts, r: int, ids: list[int], messages: list[Message], info,
                        sampled: list[int] | None = None):
        """Server step (end of Stage 1): what the clients sent from their client step (public inference,
        the method's upload, its DP clipping/noise and encoding, fdlit.privacy.client_release, made
        where each client lives); the server counts, decodes and accounts it (``UploadPrivacy.receive``);
        under secure aggregation ``sampled`` are the clients of the key exchange."""
        server = parts.server
        at = UploadRound(r, ids, parts.num_classes, len(info.public_x), parts.facts.sample_rate, server.send_up,
                         parts.seed, sampled, server.send_down, parts.clients.masking)
        return server.privacy.receive(at, messages)

    @staticmethod
    def server_aggregate(parts: RoundParts, plan: RoundPlan, ids: list[int], uploads, info):
        """Server step (Stage 2): the teacher from the uploads, optionally the server model's
        predictions instead, sent down to the clients it heard from (what each is sent: the method's
        ``configure``); returns the result and each client's (public inputs, targets)."""
        server = parts.server
        ctx = parts.facts.server_context(plan.round, info)
        result = server.aggregate(uploads, ctx)
        keep = result.keep
        teacher = result.teacher if keep is None else result.teacher[keep]
        public_x = info.public_x if keep is None else info.public_x[keep]
        # the teacher, or the server model's predictions after its step (composed at set-up: ServerSide)
        teacher, kind = server.teacher_step(plan, public_x, teacher, result.stats, parts.tensors)
        teacher_sent, targets = encode_teacher(teacher, server.message_dtype)
        message = Message({kind: teacher_sent} if keep is None else {kind: teacher_sent, "keep_mask": keep})
        sent = server.method.configure(message, ids, ctx)
        teachers = []
        for i in ids:
            server.send_down(plan.round, i, sent[i])
            # a cache's changes rebuild, with the client's cache, the teacher the server computed
            rebuilt = sent[i] is message or server.method.client_cache
            teachers.append((public_x, targets) if rebuilt else received_teacher(sent[i], info.public_x, parts.num_classes))
        if server.method.client_cache:  # each client takes the changes into its cache, where it lives
            parts.clients.receive_step(info, {i: sent[i] for i in ids})
        return result, teachers

    @staticmethod
    def client_distil(parts: RoundParts, plan: RoundPlan, ids: list[int],
                      teachers: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
        """Client step (Stage 2): each client that heard the teacher distils from it."""
        if not any(len(x) for x, _ in teachers):
            return [math.nan] * len(ids)
        losses = parts.clients.distil(ids, teachers, parts.settings.public_epochs_of(plan.round),
                                      parts.public_batch_size)
        lost = parts.clients.unreachable()  # a node that stopped answering during the public phase
        check_finite([v for i, v in zip(ids, losses, strict=True) if i not in lost], plan.round, "public",
                     [i for i in ids if i not in lost])
        return losses


class ParameterExchange(Protocol):
    """Parameter exchange: each client whose upload arrives sends what its client part returns (its
    parameters), the server aggregates them, the broadcast goes down to every client and the client
    part loads it; no public phase. Every client receives the global model, sampled or not, because
    FedAvg's next sampled clients start from it and evaluation measures it on every client. "After
    public" accuracies are those of the model every client holds after the exchange."""

    upload = "parameters"

    def upload_info(self, parts, plan):
        return info_of(parts, plan, list(plan.arrived), public=False)

    def receive(self, parts, plan, sent):
        server = parts.server
        ids, raw = arrived(parts, plan, sent)
        if not ids:  # no upload arrived: every client keeps what it has
            return nothing()
        # counted; under secure aggregation masked (fdlit.privacy.secure_upload): the rule is given only the sums
        at = UploadRound(plan.round, ids, parts.num_classes, 0, parts.facts.sample_rate, server.send_up,
                         parts.seed, plan.sampled, server.send_down, parts.clients.masking)
        return Received(ids, *server.privacy.receive(at, raw))

    def aggregate(self, parts, plan, received):
        server, m = parts.server, len(parts.clients)
        if not received.ids:
            return None, None
        if received.uploads is None:  # too few survived to unmask: every client keeps what it has; secagg/* says why
            return AggregationResult(None, stats=received.stats), None
        ctx = parts.facts.server_context(plan.round, info_of(parts, plan, received.ids, public=False))
        result = server.aggregate(received.uploads, ctx)
        result.stats.update(received.stats)
        sent = server.method.configure(Message(result.broadcast), list(range(m)), ctx)
        for i in range(m):
            server.send_down(plan.round, i, sent[i])
        if all(sent[i] is sent[0] for i in range(m)):  # one message for all: what the server last broadcast
            server.refresh(sent[0])
        return result, sent

    def distil(self, parts, plan, received, down):
        if down is not None:  # every client loads the global model (may travel with the next request)
            parts.clients.receive_step(parts.facts.info(plan.round), down)
        return [math.nan] * len(parts.clients)


class NoExchange(Protocol):
    """The baselines (fdlit.federation.baselines): no communication, no public phase."""

    communicates = False

    def setup(self, parts) -> None:
        pass

    def stop_reason(self, parts, r: int) -> str | None:
        return None

    def receive(self, parts, plan, sent):
        return nothing()

    def aggregate(self, parts, plan, received):
        return None, None

    def distil(self, parts, plan, received, down):
        return [math.nan] * len(parts.clients)

    def evaluate(self, parts, plan, after_private):
        if after_private is None:  # not measured after the private phase (federation.eval_after_private)
            return partial(parts.evaluated, plan)
        return lambda: after_private  # nothing changed the clients since the private phase


PROTOCOLS = {"predictions": PredictionExchange, "parameters": ParameterExchange}


def protocol_for(method: Aggregator, mode: str) -> Protocol:
    """The round's protocol: none for the baselines, else its ``exchange``'s."""
    if mode != "fd":
        return NoExchange()
    if method.exchange not in PROTOCOLS:
        raise ConfigError("aggregator", f"{type(method).__name__}.exchange is {method.exchange!r}; allowed: "
                          f"{', '.join(PROTOCOLS)}")
    return PROTOCOLS[method.exchange]()
