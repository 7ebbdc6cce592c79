"""Protocols: what is exchanged after the private phase, as client steps and server steps.

A protocol turns one round's plan into messages: client steps run where the clients live (through
the executor: inference, the method's client part, training) and return what each client sends;
server steps run on the server (the method's server part, the server model, the ledger). Every
message up or down goes through the communication ledger once. The loop picks the protocol once,
from the mode and the method, and never branches on it:

* :class:`PredictionExchange` (federated distillation, Kovalchuk et al. 2026, Algorithm 1, lines
  6-14): public inference and the method's upload -> aggregation into a teacher -> the teacher
  down -> the public (distillation) phase;
* :class:`ParameterExchange` (FedAvg and its relatives): parameters up -> the global model down to
  every client; no public phase;
* :class:`NoExchange` (the local-only and reference baselines): nothing is sent.

A method may name its own protocol class (``protocol`` attribute); otherwise its ``exchange``
(``"predictions"`` or ``"parameters"``) chooses.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fdlit.federation.measurement import check_finite
from fdlit.federation.round_facts import RoundPlan
from fdlit.methods.contexts import DistillationContext


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


class Protocol:
    """One round's exchange after the private phase, and the method's one-off set-up before round 1.

    A protocol is part of fdlit's round, not of a method: its steps get ``fed``, the federation
    (the :class:`~fdlit.federation.loop.FederationLoop`'s clients, executor, ledger, privacy layer
    and round facts), and hand the method only its contexts.

    ``run`` returns (the server's AggregationResult or None, public-phase losses, accuracies after
    the exchange or None when the round is not evaluated)."""

    communicates = True  # False: the baselines, which send nothing (set-up, DP and budget included)

    # ------------------------------------------------------------------ round 0
    def setup(self, fed: Any) -> None:
        """Before round 1: the method's public warm-up and its set-up exchange, if it has them."""
        self.public_warmup(fed)
        if fed.aggregator.has_setup:
            self.method_setup(fed)

    def public_warmup(self, fed: Any) -> None:
        """For methods that ask (``public_warmup_epochs`` > 0, e.g. FedMD's transfer learning): every
        client trains on the labelled public set with the private loss. The public set is known to
        every party, so nothing is sent."""
        epochs = int(getattr(fed.aggregator, "public_warmup_epochs", 0) or 0)
        if epochs > 0:
            losses = fed.executor.train(fed.clients, "private", [(fed.public_x, fed.public_y)] * len(fed.clients),
                                        epochs, fed.optimization.batch_size)
            check_finite(losses, 0, "public warm-up")

    def method_setup(self, fed: Any) -> None:
        """Round 0: the method's one-off client work where the clients live, the server's set-up,
        and its broadcast; every message is counted as round 0."""
        info = fed.facts.info(0)
        raw = fed.executor.client_hook("setup", fed.method_part, info, fed.clients, fed.client_data, {})
        uploads = [fed.send_up(0, i, payload) for i, payload in enumerate(raw)]
        broadcast = fed.aggregator.server_setup(uploads, fed.facts.server_context(0)) or {}
        for i in range(len(fed.clients)):
            for kind, tensor in broadcast.items():
                fed.ledger.send(0, i, "down", kind, tensor)
        fed.received = dict(broadcast)
        if fed.method_part.has_receive:  # e.g. parameter exchange: every client starts from the server's model
            fed.executor.client_hook("receive", fed.method_part, info, fed.clients, fed.client_data,
                                     fed.received)

    def stop_reason(self, fed: Any, r: int) -> str | None:
        """Why the run stops before round r (the privacy budget is spent), or None."""
        return fed.privacy.over_budget(r, fed.facts.sample_rate)

    # ------------------------------------------------------------------ a round
    def run(self, fed: Any, plan: RoundPlan, after_private: Any) -> tuple[Any, list[float], Any]:
        raise NotImplementedError


def info_of(fed, plan, ids: list[int], public: bool = True):
    """What the clients ``ids`` and the server know in this round (``public``: with the round's public subset)."""
    everyone = len(ids) == len(fed.clients)
    return fed.facts.info(plan.round, () if everyone else tuple(ids), plan.public_index if public else None)


def arrived(fed, ids: list[int], replies: list) -> tuple[list[int], list]:
    """The clients whose upload arrived, and their replies: a node lost during the upload step (a
    deployment) leaves its clients out, as dropouts of this round."""
    lost = fed.executor.unreachable()
    kept = [j for j, i in enumerate(ids) if i not in lost]
    return [ids[j] for j in kept], [replies[j] for j in kept]


class PredictionExchange(Protocol):
    """Federated distillation: predictions up, a teacher down, then the public phase."""

    def run(self, fed, plan, after_private):
        ids = list(plan.arrived)
        if ids:
            ids, uploads, privacy_stats = self.client_upload(fed, plan.round, ids, info_of(fed, plan, ids))
        if not ids:  # no upload arrived: no teacher, no public phase
            return None, [math.nan], fed.evaluate(plan.eval_rows) if plan.evaluated else None
        info = info_of(fed, plan, ids)  # the clients whose uploads arrived
        result, public_x, targets = self.server_aggregate(fed, plan, ids, uploads, info)
        result.stats.update(privacy_stats)
        public_losses = self.client_distil(fed, plan, ids, public_x, targets)
        return result, public_losses, fed.evaluate(plan.eval_rows) if plan.evaluated else None

    @staticmethod
    def client_upload(fed, r: int, ids: list[int], info):
        """Client step (end of Stage 1), where each client lives: public inference, the method's upload,
        its DP clipping/noise and encoding (fdlit.privacy.client_release); the server then counts,
        decodes and accounts what arrived (``UploadPrivacy.receive``)."""
        messages = fed.executor.upload(fed.method_part, info, fed.subset(fed.clients, ids),
                                       fed.subset(fed.client_data, ids), fed.received, fed.release)
        ids, messages = arrived(fed, ids, messages)
        messages = fed.adversaries.collude_uploads(r, ids, messages)
        uploads, stats = fed.privacy.receive(r, ids, messages, fed.data.num_classes, len(info.public_x),
                                             fed.facts.sample_rate, fed.send_up, fed.seed)
        return ids, uploads, stats

    @staticmethod
    def server_aggregate(fed, plan, ids: list[int], uploads, info):
        """Server step (Stage 2): the teacher from the uploads, optionally the server model's
        predictions instead, sent down to the clients it heard from."""
        fed.public_rows.before_aggregate(fed.aggregator, plan.round, plan.public_index)
        result = fed.aggregator.aggregate(uploads, fed.facts.server_context(plan.round, info))
        fed.public_rows.after_aggregate(fed.aggregator, plan.round, plan.public_index)
        keep = result.keep
        teacher = result.teacher if keep is None else result.teacher[keep]
        public_x = info.public_x if keep is None else info.public_x[keep]
        kind = "teacher"
        if fed.server is not None:  # server-side distillation from this teacher (fdlit.federation.server)
            rows = plan.eval_rows
            test = None if not plan.evaluated else (fed.test_x, fed.test_y) if rows is None else (
                fed.test_x[rows], fed.test_y[rows])
            server_teacher, server_metrics = fed.server.round(plan.first, public_x, teacher, test)
            result.stats.update(server_metrics)
            if server_teacher is not None:  # the method broadcasts the server model's predictions
                teacher, kind = server_teacher, "server_teacher"
        teacher_sent, targets = encode_teacher(teacher, fed.message_dtype)
        for i in ids:
            fed.ledger.send(plan.round, i, "down", kind, teacher_sent)
            if keep is not None:
                fed.ledger.send(plan.round, i, "down", "keep_mask", keep)
        return result, public_x, targets

    @staticmethod
    def client_distil(fed, plan, ids: list[int], public_x: torch.Tensor, targets: torch.Tensor) -> list[float]:
        """Client step (Stage 2): each client that heard the teacher distils from it."""
        if not len(public_x):
            return [math.nan] * len(ids)
        losses = fed.executor.train(
            fed.subset(fed.clients, ids), "public",
            [fed.method_part.distillation_set(DistillationContext(i, public_x, targets, *fed.private[i])) for i in ids],
            fed.public_epochs_first if plan.first else fed.public_epochs, fed.optimization.public_batch_size,
        )
        lost = fed.executor.unreachable()  # a node that stopped answering during the public phase
        check_finite([v for i, v in zip(ids, losses, strict=True) if i not in lost], plan.round, "public",
                     [i for i in ids if i not in lost])
        return losses


class ParameterExchange(Protocol):
    """Parameter exchange: each client whose upload arrives sends what its client part returns (its
    parameters), the server aggregates them, the broadcast goes down to every client and the client
    part loads it; no public phase. Every client receives the global model, sampled or not, because
    FedAvg's next sampled clients start from it and evaluation measures it on every client. "After
    public" accuracies are those of the model every client holds after the exchange."""

    def run(self, fed, plan, after_private):
        ids = list(plan.arrived)
        m = len(fed.clients)
        if ids:
            raw = fed.executor.client_hook("upload", fed.method_part, info_of(fed, plan, ids, public=False),
                                           fed.subset(fed.clients, ids), fed.subset(fed.client_data, ids), fed.received)
            ids, raw = arrived(fed, ids, raw)
        if not ids:  # no upload arrived: every client keeps what it has
            return None, [math.nan] * m, fed.evaluate(plan.eval_rows) if plan.evaluated else None
        info = info_of(fed, plan, ids, public=False)  # the clients whose uploads arrived
        raw = fed.adversaries.collude_uploads(plan.round, ids, raw)
        uploads = [fed.send_up(plan.round, ids[j], payload) for j, payload in enumerate(raw)]
        result = fed.aggregator.aggregate(uploads, fed.facts.server_context(plan.round, info))
        for i in range(m):
            for kind, tensor in fed.aggregator.messages_to(i, m, result.broadcast).items():
                fed.ledger.send(plan.round, i, "down", kind, tensor)
        fed.executor.client_hook("receive", fed.method_part, fed.facts.info(plan.round), fed.clients,
                                 fed.client_data, result.broadcast)
        return result, [math.nan] * m, fed.evaluate(plan.eval_rows) if plan.evaluated else None


class NoExchange(Protocol):
    """The baselines (fdlit.federation.baselines): no communication, no public phase."""

    communicates = False

    def setup(self, fed) -> None:
        pass

    def stop_reason(self, fed, r: int) -> str | None:
        return None

    def run(self, fed, plan, after_private):
        return None, [math.nan] * len(fed.clients), after_private


PROTOCOLS = {"predictions": PredictionExchange, "parameters": ParameterExchange}


def protocol_for(method: Any, mode: str) -> Protocol:
    """The round's protocol: none for the baselines, else the method's own or its ``exchange``'s."""
    if mode != "fd":
        return NoExchange()
    return (getattr(method, "protocol", None) or PROTOCOLS[method.exchange])()
