"""FederationLoop: runs the rounds of Kovalchuk et al. 2026, Algorithm 1, and calls callbacks at named hooks.

Read top to bottom: ``setup`` builds the clients (:mod:`fdlit.federation.construction`), ``fit``
runs the method's set-up and the rounds, ``run_round`` is one round exactly as in docs/algorithms.md
("The round"): the private phase and its evaluation, then the exchange of the round's protocol
(:mod:`fdlit.federation.protocols`), then the round's metrics (:mod:`fdlit.federation.measurement`).
Who takes part and what every party knows is :mod:`fdlit.federation.round_facts`. The loop knows
nothing of run directories, W&B or checkpoint files: those observe it through callbacks, and a
checkpoint is ``state_dict()``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Literal

import torch

from fdlit.adversaries import Adversaries
from fdlit.callbacks import FederationCallback
from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import ClientExecutor, select_executor
from fdlit.federation import measurement
from fdlit.federation.baselines import MODES
from fdlit.federation.checks import check_before_data
from fdlit.federation.communication import CommunicationLedger
from fdlit.federation.construction import (
    MESSAGE_DTYPES,
    build_clients,
    check_loop_settings,
    device_tensors,
    eval_rows,
    import_client_class,
)
from fdlit.federation.devices import Devices, check_devices
from fdlit.federation.measurement import Evaluation, check_finite
from fdlit.federation.participation import Participation
from fdlit.federation.protocols import protocol_for
from fdlit.federation.public_rows import PublicRowsGuard
from fdlit.federation.round_facts import RoundFacts
from fdlit.federation.state import load_loop_state, loop_state
from fdlit.methods.base import Aggregator
from fdlit.models.build import ModelSpec
from fdlit.privacy import UploadPrivacy


class FederationLoop:
    """Federated distillation, round by round.

    Args:
        rounds: R, communication rounds.
        private_epochs_first: private-phase epochs in round 1 ("first round epochs" of the core paper's Table 2).
        private_epochs: private-phase epochs in later rounds.
        public_epochs_first: public (distillation) epochs in round 1.
        public_epochs: public epochs in later rounds.
        executor: how clients run; null picks the fastest that applies (``select_executor``:
            vectorized when all clients share a supported architecture, except large models
            (ResNet-sized) on a CPU; else sequential).
        accelerator: Lightning accelerator (``auto``, ``cpu``, ``cuda``, ``mps``).
        devices: which device: ``auto`` (the first) or a GPU's index (``1`` or ``[1]``); see
            :mod:`fdlit.federation.devices`.
        precision: Lightning precision: ``32-true``, ``bf16-mixed``, ``16-mixed`` or ``64-true``.
        message_dtype: dtype of logits sent up and of the teacher sent down (counted as sent).
        callbacks: extra :class:`FederationCallback` objects.
        mode: ``fd`` (federated distillation), ``local_only`` (private phase only, no communication) or
            ``reference`` (one model on all classes with |D_pub| + |D_i| labelled samples); see
            :mod:`fdlit.federation.baselines`.
        client_class: the client, a subclass of ``fdlit.clients.ClientModule`` by import path (e.g.
            one whose ``public_loss`` uses a KD temperature).
        eval_every_n_rounds: evaluate every client on the test set (after each phase) in round 1,
            every n-th round and the last round only. Rounds in between log their accuracies as
            NaN (null in metrics.jsonl, left out of W&B) and ``eval/test_samples`` 0; summaries and
            "best" use evaluated rounds only.
        eval_subsample: evaluate rounds before the last on a fixed random subset of this many test
            samples (drawn once from the seed, the same subset every round); the last round always
            uses the whole test set. null: the whole test set every time.
        channels_last: store every client network's 4-D weights channels-last
            (``torch.channels_last``; convolutions then run in NHWC, usually faster on GPUs with
            tensor cores). Same results up to float rounding.
        compile: compile the training computation with ``torch.compile``: the sequential executor
            compiles each client network's forward, the vectorized executor its vmapped training
            step (once per architecture and phase). The first steps pay the compilation. Not
            available with the Ray executor.
        compile_backend: the ``torch.compile`` backend (``inductor``, the default compiler; e.g.
            ``aot_eager`` to check a model traces without generating code).
        participation: client sampling, dropout, late joiners and a per-round public subset
            (:class:`~fdlit.federation.participation.Participation`, docs/participation.md). Unset:
            every client and the whole public set every round (the default).
    """

    def __init__(
        self,
        rounds: int = 20,
        private_epochs_first: int = 10,
        private_epochs: int = 2,
        public_epochs_first: int = 2,
        public_epochs: int = 2,
        executor: ClientExecutor | None = None,
        accelerator: str = "auto",
        devices: Devices = "auto",
        precision: str = "32-true",
        message_dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        callbacks: list[FederationCallback] = [],
        mode: Literal["fd", "local_only", "reference"] = "fd",
        client_class: str = "fdlit.clients.ClientModule",
        eval_every_n_rounds: int = 1,
        eval_subsample: int | None = None,
        channels_last: bool = False,
        compile: bool = False,
        compile_backend: str = "inductor",
        participation: Participation = Participation(),
        *,
        data: FederatedData | None = None,
        model: ModelSpec | None = None,
        client: ClientOptimization | None = None,
        aggregator: Aggregator | None = None,
        privacy: UploadPrivacy | None = None,
        seed: int = 0,
        server: Any | None = None,
        adversaries: Adversaries | None = None,
    ):
        check_loop_settings(
            rounds=rounds, precision=precision, message_dtype=message_dtype, mode=mode, modes=MODES,
            accelerator=accelerator, seed=seed, eval_every_n_rounds=eval_every_n_rounds, eval_subsample=eval_subsample,
            compile=compile, compile_backend=compile_backend,
            epochs={"private_epochs_first": private_epochs_first, "private_epochs": private_epochs,
                    "public_epochs_first": public_epochs_first, "public_epochs": public_epochs})
        if aggregator is not None and not isinstance(aggregator, Aggregator):
            raise ConfigError("aggregator", f"must be an fdlit Aggregator, got {type(aggregator).__name__}")
        self.fabric_devices = check_devices(accelerator, devices)
        self.eval_every_n_rounds, self.eval_subsample = eval_every_n_rounds, eval_subsample
        self.channels_last = channels_last
        self.compile_backend = compile_backend if compile else None
        self.mode = mode
        self.rounds = rounds
        self.private_epochs_first, self.private_epochs = private_epochs_first, private_epochs
        self.public_epochs_first, self.public_epochs = public_epochs_first, public_epochs
        self.executor = executor  # null: chosen in setup, once the clients exist
        self.accelerator, self.precision = accelerator, precision
        self.message_dtype = MESSAGE_DTYPES[message_dtype]
        self.callbacks = list(callbacks)
        self.client_class = import_client_class(client_class)
        self.data = data or FederatedData()
        self.model_spec = model or {"class_path": "fdlit.models.SmallCNN"}
        self.optimization = client or ClientOptimization()
        if aggregator is None:
            from fdlit.methods import SmoothedUncertaintyWeighted

            aggregator = SmoothedUncertaintyWeighted()
        self.aggregator = aggregator
        self.aggregator.check_config(self.model_spec, self.optimization)  # before any work
        self.protocol = protocol_for(self.aggregator, mode)
        self.privacy = privacy or UploadPrivacy()  # default: plain logits, no mechanism
        self.stop_reason: str | None = None  # set when the privacy budget ends the run early
        self.seed = seed
        # no section, or one that changes nothing: the round runs the unsampled code path; the
        # reference baseline is one pooled model, so nobody is sampled there
        full = participation is None or participation.is_full or mode == "reference"
        self.participation = None if full else participation
        # fdlit.federation.server.ServerModel, or None; trained by the prediction exchange (fd mode only)
        self.server = server if server is not None and server.enabled and mode == "fd" else None
        self.round = 0  # last completed round; 0 before round 1 (the method's set-up is "round 0")
        self.history: list[dict[str, Any]] = []
        self.ledger = CommunicationLedger()
        self.received: dict[str, torch.Tensor] = {}  # what the server broadcast at set-up
        self.wall_time = 0.0
        self._setup_started: float | None = None
        self.is_setup = False
        self.adversaries = adversaries or Adversaries()
        check_before_data(self)  # what the config alone shows to be impossible, before any data loads

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        """Everything that can fail on bad input happens here, before any training."""
        if self.is_setup:
            return
        self._setup_started = time.perf_counter()  # the run's wall time includes data and executor start-up
        from fdlit.execution.device import defer_dynamo_import, make_device, seed_everything

        seed_everything(self.seed)
        if self.compile_backend is None:
            defer_dynamo_import()
        if not self.data.is_setup:
            self.data.setup(self.seed)
        if self.protocol.communicates:
            self.privacy.check(self.aggregator, self.data.num_classes)
            self.release = self.privacy.client_release(self.message_dtype, self.seed)  # applied on each client
        self.fabric = make_device(self.accelerator, self.precision, self.fabric_devices)
        device = self.fabric.device
        build_clients(self)  # client_data, clients, method_part
        # test_x/y, public_x/y, private, val_x/y, local_mask_matrix
        self.__dict__.update(device_tensors(self.data, self.client_data, device))
        if self.participation is not None:
            self.participation.check(len(self.clients), len(self.public_x))
        self.eval_rows = eval_rows(self.eval_subsample, len(self.test_y), self.seed)
        self.eval_rows = None if self.eval_rows is None else self.eval_rows.to(device)
        self.facts = RoundFacts(self.seed, self.rounds, len(self.clients), self.data.num_classes, self.public_x,
                                self.public_y, tuple(tuple(cd.classes) for cd in self.client_data),
                                self.participation, (self.private_epochs_first, self.private_epochs),
                                self.eval_every_n_rounds, self.eval_rows)
        if self.channels_last:
            for c in self.clients:
                c.model.to(memory_format=torch.channels_last)  # 4-D weights only; the rest is unchanged
        if self.executor is None:  # null: the fastest executor that applies (fdlit.execution.vectorized)
            self.executor = select_executor(self.clients, self.precision, sample=self.public_x[:1])
        self.executor.configure(self.compile_backend)
        self.executor.setup(self.fabric, self.clients)
        self.public_rows = PublicRowsGuard(len(self.public_x))
        self.evaluate = Evaluation(lambda x: self.executor.predict(self.clients, x), (self.test_x, self.test_y),
                                   self.local_mask_matrix, (self.val_x, self.val_y))
        if self.server is not None:  # on the driver, whatever the executor
            self.server.setup(self.data.input_shape, self.data.num_classes, self.seed, device,
                              getattr(self.data, "input_transform", None))
        self.executor.progress = self._clients_progress
        self.is_setup = True

    @staticmethod
    def subset(items: Sequence, ids: list[int]) -> Sequence:
        """``items`` (one per client) of the clients ``ids``; the list itself when that is everyone."""
        return items if len(ids) == len(items) else [items[i] for i in ids]

    def send_up(self, r: int, client: int, payload: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # keys starting with "_" are in-process diagnostics, not messages
        return {kind: t if kind.startswith("_") else self.ledger.send(r, client, "up", kind, t)
                for kind, t in payload.items()}

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict[str, Any]:
        self.setup()
        started, self._setup_started = self._setup_started or time.perf_counter(), None
        start = started - self.wall_time  # a resumed run continues its wall time
        for cb in self.callbacks:
            cb.on_fit_start(self)
        try:
            if self.round == 0:
                self.protocol.setup(self)
            for r in range(self.round + 1, self.rounds + 1):
                if reason := self.protocol.stop_reason(self, r):
                    self.stop_reason = reason  # the last round is complete and checkpointed
                    break
                self.run_round(r, clock=start)
        finally:
            self.executor.teardown(self.clients)  # remote executors: final state back into self.clients
        self.wall_time = time.perf_counter() - start
        summary = self.summary()
        for cb in self.callbacks:
            cb.on_fit_end(self, summary)
        return summary

    def _clients_progress(self, phase: str, done: float, total: int) -> None:
        for cb in self.callbacks:
            cb.on_clients_progress(self, phase, done, total)

    def run_round(self, r: int, clock: float | None = None) -> dict[str, Any]:
        """One round of Kovalchuk et al. 2026, Algorithm 1 (docs/algorithms.md, "The round")."""
        t0 = time.perf_counter()
        for cb in self.callbacks:
            cb.on_round_start(self, r)
        plan = self.facts.plan(r)  # who takes part: clients not sampled do nothing this round
        # Stage 1 starts: the private phase of the sampled clients, evaluated
        private_losses = []
        if plan.sampled:
            private_losses = self.executor.train(
                self.subset(self.clients, plan.sampled), "private",
                self.subset(self.adversaries.private_sets(r, self.private, self.data.num_classes), plan.sampled),
                self.private_epochs_first if plan.first else self.private_epochs, self.optimization.batch_size)
        lost = self.executor.unreachable()  # clients whose node stopped answering: dropped this round
        if lost:
            plan = dataclasses.replace(plan, arrived=[i for i in plan.arrived if i not in lost])
            private_losses = [v for i, v in zip(plan.sampled, private_losses, strict=True) if i not in lost]
        check_finite(private_losses, r, "private", [i for i in plan.sampled if i not in lost])
        after_private = self.evaluate(plan.eval_rows) if plan.evaluated else None
        # the rest of the round: the protocol's exchange (fdlit.federation.protocols)
        result, public_losses, after_public = self.protocol.run(self, plan, after_private)
        if later := self.executor.unreachable() - set(lost):  # lost during the exchange: dropouts too
            plan, lost = dataclasses.replace(plan, arrived=[i for i in plan.arrived if i not in later]), lost | later

        metrics = measurement.round_metrics(self, plan, result, (private_losses, public_losses),
                                            (after_private, after_public), lost, t0)
        metrics.update(self.adversaries.after_round(self, plan, result, after_public))
        self.round = r
        self.history.append(metrics)
        if clock is not None:
            self.wall_time = time.perf_counter() - clock
        for cb in self.callbacks:
            cb.on_round_end(self, r, metrics)
        return metrics

    # ------------------------------------------------------------------ state (fdlit.federation.state)
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly (tensors and plain data)."""
        return loop_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (after ``setup``, before ``fit``)."""
        self.setup()
        load_loop_state(self, state)

    def summary(self) -> dict[str, Any]:
        """Best and final numbers of the run (fdlit.federation.measurement.summary)."""
        return measurement.summary(
            self.history, rounds_done=self.round, rounds=self.rounds, test_samples=len(self.test_y),
            bytes_up=self.ledger.total("up"), bytes_down=self.ledger.total("down"), wall_time=self.wall_time,
            client_classes=[[int(c) for c in cd.classes] for cd in self.client_data])
