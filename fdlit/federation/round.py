"""One round of federated distillation, in the order of Kovalchuk et al. 2026, Algorithm 1.

    plan: who is sampled, who arrives, the public rows          RoundFacts.plan (participation)
    lines 3-7   private training on each sampled client (CE),
                public inference and upload of each arriving one  one client step (ClientSide.round_step)
                evaluation after the private phase
    line 7      the server receives the uploads                 exchange.receive (ledger, privacy layer)
    lines 9-12  aggregation into the teacher (or a global
                model), broadcast                               exchange.aggregate (the method's server part)
    lines 13-15 public refinement (distillation)                exchange.distil (each client, where it lives)
                evaluation after the exchange, the round's metrics

What varies is composed once at set-up and never branched on here: the exchange
(:mod:`fdlit.federation.protocols`: predictions for FD, parameters for the FedAvg family, nothing for
the baselines), the privacy layer (the release each client's upload passes, ``UploadPrivacy.receive``
on the server), the attacks (the client part they wrap, the private sets they poison), participation
(the plan), where the clients live (the executor, :mod:`fdlit.execution.steps`; a deployment closes a
round when its evaluation comes back with the next request) and what observes a round
(:class:`RoundExtra`: the attacks' metrics, the upload audit, the validation selection).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

from fdlit.execution import steps
from fdlit.federation import measurement
from fdlit.federation.evaluation import Accuracies
from fdlit.federation.measurement import check_finite
from fdlit.federation.protocols import Protocol, Received
from fdlit.federation.round_facts import RoundPlan
from fdlit.federation.round_parts import RoundParts
from fdlit.messages import Message, Metrics
from fdlit.methods.base import AggregationResult


class RoundExtra:
    """What the config adds to every round, composed at set-up (:mod:`fdlit.federation.round_extras`);
    the round calls these hooks in order and never asks what an extra is."""

    def plan(self, plan: RoundPlan) -> RoundPlan:
        """Who takes part in the round (a virtual clock's next arrivals)."""
        return plan

    def private_sets(self, r: int, sets: list) -> list:
        """The (inputs, labels) each client trains on in round r."""
        return sets

    def arrived(self, plan: RoundPlan, sent: dict[int, Message]) -> RoundPlan:
        """After the client step: whose uploads count (a deadline drops the late ones)."""
        return plan

    def after_private(self, plan: RoundPlan, accuracies: Accuracies | None) -> None:
        """After the private phase's evaluation."""

    def uploads(self, plan: RoundPlan, sent: dict[int, Message]) -> dict[int, Message]:
        """What reaches the server of what each client sent (by client id)."""
        return sent

    def received(self, plan: RoundPlan, received: Received) -> None:
        """After the server received the uploads (its ``stats`` go with the round's result)."""

    def exchanged(self, plan: RoundPlan) -> None:
        """After the exchange, before its evaluation."""

    def after_exchange(self, plan: RoundPlan, accuracies: Accuracies | None) -> None:
        """After the evaluation that follows the exchange."""

    def metrics(self, plan: RoundPlan, result: AggregationResult | None, after_public: Accuracies | None) -> Metrics:
        """The round's metrics this extra adds."""
        return {}


class FederatedRound:
    """One round over the federation's parts (:class:`~fdlit.federation.round_parts.RoundParts`).

    Args:
        parts: the federation's parts.
        exchange: the round's protocol (what is exchanged after the private phase).
        extras: what observes or changes a round, composed at set-up (:class:`RoundExtra`).
    """

    def __init__(self, parts: RoundParts, exchange: Protocol, extras: Sequence[RoundExtra]):
        self.parts, self.exchange, self.extras = parts, exchange, list(extras)
        self.reported_at = -math.inf  # when the last round was closed (perf_counter)

    def run(self, r: int, t0: float, close: Callable[[int, Metrics], None]) -> Metrics | None:
        """Round r, begun at ``t0`` (perf_counter); ``close(r, metrics)`` ends it (the run's history, the
        callbacks). Returns its metrics, or None when the executor closes it later (steps.when_evaluated)."""
        parts, clients, exchange = self.parts, self.parts.clients, self.exchange
        plan = parts.facts.plan(r)  # who takes part: clients not sampled do nothing this round
        for extra in self.extras:
            plan = extra.plan(plan)
        # lines 3-7: the sampled clients' private training, then what the arriving ones send (one client step)
        private_losses, sent = self.client_step(plan)
        steps.close_waiting(clients.executor)  # a previous round whose evaluation came back with this step
        plan, private_losses, lost = self.without_unreachable(plan, private_losses, frozenset())
        check_finite(private_losses, r, "private", [i for i in plan.sampled if i not in lost])
        for extra in self.extras:
            plan = extra.arrived(plan, {i: m for i, m in sent.items() if i in plan.arrived})
        after_private = parts.evaluated(plan) if parts.settings.eval_after_private else None
        for extra in self.extras:
            extra.after_private(plan, after_private)
        # line 7: the server receives; lines 9-12: aggregation, broadcast; lines 13-15: public refinement
        for extra in self.extras:
            sent = extra.uploads(plan, sent)
        received = exchange.receive(parts, plan, sent)
        for extra in self.extras:
            extra.received(plan, received)
        result, down = exchange.aggregate(parts, plan, received)
        public_losses = exchange.distil(parts, plan, received, down)
        plan, _, lost = self.without_unreachable(plan, [], lost)  # lost during the exchange: dropouts too
        for extra in self.extras:
            extra.exchanged(plan)
        done = (plan, result, (private_losses, public_losses), after_private, lost, t0)
        return steps.when_evaluated(clients.executor, exchange.evaluate(parts, plan, after_private),
                                    lambda after_public: self.close(done, after_public, close))

    def client_step(self, plan: RoundPlan) -> tuple[list[float], dict]:
        """The private phase of the sampled clients, then the upload of the arriving ones."""
        if not plan.sampled:
            return [], {}
        parts, clients, exchange = self.parts, self.parts.clients, self.exchange
        private_sets = parts.tensors.private
        for extra in self.extras:
            private_sets = extra.private_sets(plan.round, private_sets)
        upload = exchange.upload if plan.arrived else None
        return clients.round_step(plan, clients.subset(private_sets, plan.sampled),
                                  parts.settings.private_epochs_of(plan.round), parts.batch_size, upload,
                                  exchange.upload_info(parts, plan) if upload else None, parts.server.received)

    def without_unreachable(self, plan: RoundPlan, losses: list[float], known: frozenset[int]
                            ) -> tuple[RoundPlan, list[float], frozenset[int]]:
        """Clients whose node stopped answering (a deployment) since ``known``: dropped from the round's
        arrivals (and their private losses); returns the plan, the losses and every client lost."""
        lost = self.parts.clients.unreachable()
        new = lost - known
        if not new:
            return plan, losses, known
        plan = dataclasses.replace(plan, arrived=[i for i in plan.arrived if i not in new])
        losses = [v for i, v in zip(plan.sampled, losses, strict=True) if i not in new] if losses else losses
        return plan, losses, known | new

    def close(self, done: tuple, after_public: Accuracies | None, close: Callable[[int, Metrics], None]) -> Metrics:
        """The round's end: its metrics (``time/round_s``: since it began, or since the previous round
        closed when that came later), what the extras add, then ``close``."""
        plan, result, losses, after_private, lost, t0 = done
        for extra in self.extras:
            extra.after_exchange(plan, after_public)
        metrics = measurement.round_metrics(self.parts, self.exchange.communicates, plan, result, losses,
                                            (after_private, after_public), lost, max(t0, self.reported_at))
        for extra in self.extras:
            metrics.update(extra.metrics(plan, result, after_public))
        close(plan.round, metrics)
        self.reported_at = time.perf_counter()
        return metrics
