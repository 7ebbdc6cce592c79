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

import time
from typing import Any

from fdlit.adversaries import Adversaries
from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import steps
from fdlit.federation import baselines, measurement
from fdlit.federation.checks import check_before_data
from fdlit.federation.clock.async_exchange import clocked
from fdlit.federation.construction import InitialDraws, check_seed, use_cuda_graphs
from fdlit.federation.protocols import protocol_for
from fdlit.federation.round import FederatedRound
from fdlit.federation.round_extras import round_extras
from fdlit.federation.round_parts import FederationSections, RoundParts, build_parts
from fdlit.federation.round_view import LoopView
from fdlit.federation.selection import ExactSelection
from fdlit.federation.server import ServerModel
from fdlit.federation.server_side import ServerSide
from fdlit.federation.settings import FederationSettings
from fdlit.messages import Metrics
from fdlit.methods.base import Aggregator
from fdlit.models.build import ModelSpec
from fdlit.privacy import UploadPrivacy


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
        # what the config alone shows to be impossible, before any data loads
        check_before_data(self.settings, self.data, aggregator, self.privacy, self.adversaries)
        if self.clock is not None:
            self.clock.check(self.settings, aggregator, self.privacy, server)
        self.protocol = clocked(self.clock, self.protocol)

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
        sections = FederationSections(s, self.data, self.model_spec, self.optimization, self.server_side,
                                      self.adversaries, self.seed)
        self.parts, self.draws = build_parts(sections, self.fabric.device, release, self.hosted, self.draws)
        parts, executor = self.parts, s.executor
        if self.clock is not None:
            self.clock.start(len(parts.clients), self.seed)
        steps.configure(executor, s.compile_backend)
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
        # the round's order over the parts, with what the config adds to it (composed here, once)
        audit = self.privacy.upload_audit and self.protocol.communicates
        extras = round_extras(parts, self.adversaries, self.selection, audit, self.protocol, self.clock)
        self.federated_round = FederatedRound(parts, self.protocol, extras)

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
                    steps.close_waiting(self.parts.clients.executor)
                    if self.history:
                        self.history[-1].update(self.selection.finish())
                    break
                self.run_round(r, clock=start)
            steps.close_waiting(self.parts.clients.executor)  # a last round that waits for its evaluation
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
        """One round of Kovalchuk et al. 2026, Algorithm 1 (:mod:`fdlit.federation.round`; docs/algorithms.md,
        "The round"); None when the executor closes it later (its evaluation after the exchange comes with
        the clients' next request: fdlit.execution.steps.when_evaluated)."""
        t0 = time.perf_counter()
        for cb in self.callbacks:
            cb.on_round_start(self.view, r)
        return self.federated_round.run(r, t0, lambda r, metrics: self._round_closed(r, metrics, clock))

    def _round_closed(self, r: int, metrics: Metrics, clock: float | None) -> None:
        """A round's metrics are in: the run's history and wall time, then the callbacks."""
        self.round = r
        self.history.append(metrics)
        if clock is not None:
            self.wall_time = time.perf_counter() - clock
        for cb in self.callbacks:
            cb.on_round_end(self.view, r, metrics)

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
        return measurement.summary(
            self.history, rounds_done=self.round, rounds=self.settings.rounds,
            test_samples=len(self.parts.tensors.test_y), ledger=self.server_side.ledger, wall_time=self.wall_time,
            client_classes=[[int(c) for c in cd.classes] for cd in self.parts.clients.client_data],
            measured_network=baselines.measured_network(self.settings.mode, self.server_side.method))
