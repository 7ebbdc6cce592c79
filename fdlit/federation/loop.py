"""FederationLoop: runs the rounds of Kovalchuk et al. 2026, Algorithm 1, and calls callbacks at named hooks.

Read top to bottom: ``setup`` builds the federation's parts (the clients' side, the server's side,
the round's facts, the data on the device: :func:`fdlit.federation.round_parts.build_parts`) and
starts the executor, ``fit`` runs the method's set-up and the rounds, ``run_round`` is one round
exactly as in docs/algorithms.md ("The round"): the private phase and its evaluation, then the
exchange of the round's protocol (:mod:`fdlit.federation.protocols`), then the round's metrics
(:mod:`fdlit.federation.measurement`).
The steps get the parts, never the loop. The loop knows nothing of run directories, W&B or
checkpoint files: callbacks observe a read-only view of it (``view``, a RoundView); a checkpoint is
``state_dict()``. What the run is made of is read from its parts (``parts``, ``server_side``,
``settings``): the loop forwards none of them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from fdlit.adversaries import Adversaries
from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.federation import baselines, measurement
from fdlit.federation.checks import check_before_data
from fdlit.federation.clock.async_exchange import clocked
from fdlit.federation.construction import InitialDraws, check_seed, use_cuda_graphs
from fdlit.federation.measurement import check_finite
from fdlit.federation.protocols import CARRIED, protocol_for
from fdlit.federation.round_parts import RoundParts, build_parts
from fdlit.federation.round_view import LoopView
from fdlit.federation.selection import ExactSelection
from fdlit.federation.server import ServerModel
from fdlit.federation.server_side import ServerSide
from fdlit.federation.settings import FederationSettings
from fdlit.methods.base import Aggregator
from fdlit.models.build import ModelSpec
from fdlit.privacy import UploadPrivacy
from fdlit.records import Metrics


class FederationLoop:
    """Federated distillation, round by round, from the config's sections.

    Args:
        federation: the ``federation`` section (:class:`~fdlit.federation.settings.FederationSettings`:
            rounds, epochs, executor, device, evaluation, participation); its fields may also be given
            as keywords (``FederationLoop(rounds=2, data=...)``).
        data, model, client, aggregator, privacy, server, adversaries: the config's sections (the
            federated data, the client network's spec, the clients' optimisation, the method's server
            part, the upload's privacy, the optional server model, the attacks).
        seed: the run's seed.
    """

    def __init__(self, federation: FederationSettings | None = None, *, data: FederatedData | None = None,
                 model: ModelSpec | None = None, client: ClientOptimization | None = None,
                 aggregator: Aggregator | None = None, privacy: UploadPrivacy | None = None, seed: int = 0,
                 server: ServerModel | None = None, adversaries: Adversaries | None = None, **settings: object):
        if federation is not None and settings:
            raise TypeError("FederationLoop takes the federation section or its fields as keywords, not both")
        self.settings = federation if federation is not None else FederationSettings(**settings)
        if aggregator is not None and not isinstance(aggregator, Aggregator):
            raise ConfigError("aggregator", f"must be an fdlit Aggregator, got {type(aggregator).__name__}")
        self.seed = check_seed(seed)
        self.data = data or FederatedData()
        self.model_spec = model or {"class_path": "fdlit.models.SmallCNN"}
        self.optimization = client or ClientOptimization()
        if aggregator is None:
            from fdlit.methods import SmoothedUncertaintyWeighted

            aggregator = SmoothedUncertaintyWeighted()
        aggregator.check_config(self.model_spec, self.optimization)  # before any work
        self.protocol = protocol_for(aggregator, self.settings.mode)
        self.clock = self.settings.clock  # rounds on a virtual clock (fdlit.federation.clock), or None
        self.privacy = privacy or UploadPrivacy()  # default: plain logits, no mechanism
        # fdlit.federation.server.ServerModel, or None; trained by the prediction exchange (fd mode only)
        server = server if server is not None and server.enabled and self.settings.mode == "fd" else None
        self.server_side = ServerSide(aggregator, self.privacy, server, self.settings.message_dtype)
        self.adversaries = adversaries or Adversaries()
        self.callbacks, self.view = list(self.settings.callbacks), LoopView(self)  # what callbacks are given
        # the run's own state (with the parts' own in state_dict)
        self.round = 0  # last completed round; 0 before round 1 (the method's set-up is "round 0")
        self.history: list[Metrics] = []
        self.wall_time = 0.0
        self.stop_reason: str | None = None  # set when the privacy budget ends the run early
        self._setup_started: float | None = None
        self.parts: RoundParts | None = None
        self.hosted: list[int] | None = None  # a deployment node's own clients (None: every client is here)
        # the random state each client's network was drawn from: recorded by set-up, given to a node
        self.draws: InitialDraws | None = None
        # a round whose evaluation after its exchange comes back with the clients' next request
        # (ClientExecutor.receive_carried): closed, with its metrics and callbacks, once it has
        self._open: tuple | None = None
        self._reported_at = -math.inf  # when the last round was closed (perf_counter)
        self._audited: dict[int, dict] = {}  # the upload audit of a round, measured after its private phase
        # what the config alone shows to be impossible, before any data loads
        check_before_data(self.settings, self.data, aggregator, self.privacy, self.adversaries)
        if self.clock is not None:
            self.clock.check(self.settings, aggregator, self.privacy, server)
        self.protocol = clocked(self.clock, self.protocol)
        self._timed: dict[int, Metrics] = {}  # the clock's metrics of a round, measured after its exchange

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        """Everything that can fail on bad input happens here, before any training."""
        if self.parts is not None:
            return
        s = self.settings
        self._setup_started = time.perf_counter()  # the run's wall time includes data and executor start-up
        from fdlit.execution.device import defer_dynamo_import, make_device, seed_everything

        seed_everything(self.seed)
        if s.compile_backend is None:
            defer_dynamo_import()
        if not self.data.is_setup:
            self.data.setup(self.seed)
        release = None
        if self.protocol.communicates:
            self.privacy.check(self.server_side.method, self.data.num_classes)
            release = self.privacy.client_release(s.message_dtype, self.seed)  # applied on each client
        self.fabric = make_device(s.accelerator, s.precision, s.fabric_devices)
        # the parts exist before the executor starts: a remote executor names the loop's tensors in set-up
        self.parts, self.draws = build_parts(s, self.data, self.model_spec, self.optimization, self.server_side,
                                             self.adversaries, self.seed, self.fabric.device, release, self.hosted,
                                             self.draws)
        parts, executor = self.parts, s.executor
        if self.clock is not None:
            self.clock.start(len(parts.clients), self.seed)
        executor.configure(s.compile_backend)
        try:
            executor.setup(self.fabric, [c for c in parts.clients.clients if c is not None])
            if s.cuda_graphs:  # the executor that runs the clients (a stacked run's own: its inner one)
                use_cuda_graphs(getattr(executor, "inner", executor))
        except BaseException:
            self.parts = None  # not set up: a later setup() starts again
            raise
        executor.progress = self._clients_progress
        active = parts.facts.eval_rows is not None and parts.tensors.val_y is not None
        self.selection = ExactSelection(parts.clients, parts.evaluate, active=active)
        # a receive may wait for the next request unless something reads the clients between the
        # rounds: the selection keeps their weights, the upload audit queries them every round
        executor.may_carry_receive = not self.selection.active and not self.privacy.upload_audit

    # ------------------------------------------------------------------ the run
    def fit(self) -> Metrics:
        self.setup()
        started, self._setup_started = self._setup_started or time.perf_counter(), None
        start = started - self.wall_time  # a resumed run continues its wall time
        for cb in self.callbacks:
            cb.on_fit_start(self.view)
        try:
            if self.round == 0:
                self.protocol.setup(self.parts)
            for r in range(self.round + 1, self.settings.rounds + 1):
                if reason := self.protocol.stop_reason(self.parts, r):
                    self.stop_reason = reason  # the last round is complete and checkpointed
                    self._close_open(start)
                    if self.history:
                        self.history[-1].update(self.selection.finish())
                    break
                self.run_round(r, clock=start)
            self._close_open(start)  # the last round's carried evaluation: one closing request
        finally:
            side = self.parts.clients
            side.executor.teardown(side.clients)  # remote executors: final state back into the clients
        self.wall_time = time.perf_counter() - start
        summary = self.summary()
        for cb in self.callbacks:
            cb.on_fit_end(self.view, summary)
        return summary

    def _clients_progress(self, phase: str, done: float, total: int) -> None:
        for cb in self.callbacks:
            cb.on_clients_progress(self.view, phase, done, total)

    def run_round(self, r: int, clock: float | None = None) -> Metrics | None:
        """One round of Kovalchuk et al. 2026, Algorithm 1 (docs/algorithms.md, "The round"); None when
        its evaluation after the exchange comes with the next round's client step (closed right after it)."""
        parts, clients = self.parts, self.parts.clients
        t0 = time.perf_counter()
        for cb in self.callbacks:
            cb.on_round_start(self.view, r)
        plan = parts.facts.plan(r)  # who takes part: clients not sampled do nothing this round
        if self.clock is not None:  # asynchronous rounds: the next clients to arrive
            plan = self.clock.schedule(parts, plan)
        # Stage 1: the sampled clients' private phase, then what the arriving ones send (one client step)
        private_losses, sent = [], {}
        if plan.sampled:
            private_sets = self.adversaries.private_sets(r, parts.tensors.private, parts.num_classes)
            upload = self.protocol.upload if plan.arrived else None
            private_losses, sent = clients.round_step(
                r, plan.sampled, clients.subset(private_sets, plan.sampled), self.settings.private_epochs_of(r),
                parts.batch_size, upload, plan.arrived, self.protocol.upload_info(parts, plan) if upload else None,
                parts.server.received)
        self._close_open(clock)  # the previous round's evaluation came back with this step
        lost = clients.unreachable()  # clients whose node stopped answering: dropped this round
        if lost:
            plan = dataclasses.replace(plan, arrived=[i for i in plan.arrived if i not in lost])
            private_losses = [v for i, v in zip(plan.sampled, private_losses, strict=True) if i not in lost]
        check_finite(private_losses, r, "private", [i for i in plan.sampled if i not in lost])
        if self.clock is not None:  # when each upload arrives; a deadline drops the late ones
            plan = self.clock.arrive(parts, plan, {i: m for i, m in sent.items() if i in plan.arrived})
        after_private = parts.evaluated(plan)
        self.selection.observe("after_private", r, after_private)
        if self.privacy.upload_audit and self.protocol.communicates:  # the models that made the uploads
            self._audited[r] = measurement.upload_membership(parts)
        # the rest of the round: the protocol's exchange (fdlit.federation.protocols)
        result, public_losses, after_public = self.protocol.run(parts, plan, after_private, sent)
        if later := clients.unreachable() - set(lost):  # lost during the exchange: dropouts too
            plan, lost = dataclasses.replace(plan, arrived=[i for i in plan.arrived if i not in later]), lost | later
        if self.clock is not None:
            self._timed[r] = self.clock.close(parts, plan)
        opened = (plan, result, (private_losses, public_losses), after_private, lost, t0)
        if after_public is CARRIED:
            self._open = opened
            return None
        return self._close_round(*opened, after_public, clock)

    def _close_open(self, clock: float | None) -> None:
        if self._open is not None:
            opened, self._open = self._open, None
            with self.parts.clients.executor.carried_evaluation():  # the clients as they were after the round's receive
                self._close_round(*opened, self.parts.evaluated(opened[0]), clock)

    def _close_round(self, plan, result, losses, after_private, lost, t0, after_public, clock) -> Metrics:
        """The round's end: its metrics (``time/round_s``: since it began, or since the previous round
        closed when that came later), the selection, the callbacks."""
        r, parts = plan.round, self.parts
        self.selection.observe("after_public", r, after_public)
        metrics = measurement.round_metrics(parts, self.protocol.communicates, plan, result, losses,
                                            (after_private, after_public), lost, max(t0, self._reported_at))
        metrics.update(self.adversaries.after_round(parts, plan, result, after_public))
        metrics.update(self._audited.pop(r, {}))
        metrics.update(self._timed.pop(r, {}))
        if r == self.settings.rounds:  # the selected rounds, measured on the whole test set
            metrics.update(self.selection.finish())
        self.round = r
        self.history.append(metrics)
        if clock is not None:
            self.wall_time = time.perf_counter() - clock
        for cb in self.callbacks:
            cb.on_round_end(self.view, r, metrics)
        self._reported_at = time.perf_counter()
        return metrics

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly (tensors and plain data): the run's own
        state, every client's (fetched from where it lives) and the server's."""
        return {"round": self.round, "rounds": self.settings.rounds, "seed": self.seed,
                "num_clients": len(self.parts.clients),
                "clients": self.parts.clients.checkpoint_states(), **self.server_side.state_dict(),
                "history": [dict(m) for m in self.history], "wall_time": float(self.wall_time),
                "selection": self.selection.state_dict(),
                **({"clock": self.clock.state_dict()} if self.clock is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (after ``setup``, before ``fit``)."""
        self.setup()
        self.parts.clients.load_state_dict(state["clients"])
        self.server_side.load_state_dict(state)
        self.history = [dict(m) for m in state["history"]]
        self.selection.load_state_dict(state.get("selection"))
        if self.clock is not None:
            self.clock.load_state_dict(state["clock"])
        self.round = state["round"]
        self.wall_time = state["wall_time"]

    def summary(self) -> Metrics:
        """Best and final numbers of the run (fdlit.federation.measurement.summary)."""
        ledger = self.server_side.ledger
        return measurement.summary(
            self.history, rounds_done=self.round, rounds=self.settings.rounds,
            test_samples=len(self.parts.tensors.test_y),
            bytes_up=ledger.total("up"), bytes_down=ledger.total("down"), wall_time=self.wall_time,
            client_classes=[[int(c) for c in cd.classes] for cd in self.parts.clients.client_data],
            measured_network=baselines.measured_network(self.settings.mode, self.server_side.method))
