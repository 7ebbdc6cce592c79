"""FederationLoop: runs the rounds of Kovalchuk et al. 2026, Algorithm 1, and calls callbacks at named hooks.

Read top to bottom: ``setup`` builds the clients, ``fit`` runs the method's set-up and the rounds,
``run_round`` is one round exactly as in docs/algorithms.md ("The round"), ``evaluate`` measures
every client, ``summary`` condenses the history. The loop knows nothing of run directories, W&B or
checkpoint files: those observe it through callbacks, and a checkpoint is ``state_dict()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import time
from typing import Any, Literal, Optional

import numpy as np
import torch

from fdlit.aggregators.base import Aggregator, FederationInfo, ServerContext, weight_concentration, weight_entropy
from fdlit.callbacks import FederationCallback
from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError, check_at_least
from fdlit.federation.baselines import MODES, reference_client
from fdlit.federation.communication import CommunicationLedger
from fdlit.federation.diagnostics import trust_matrix
from fdlit.federation.participation import Participation
from fdlit.execution import ClientExecutor, select_executor
from fdlit.models.build import ModelSpec, build_model  # noqa: F401 (re-exported: fdlit.federation.build_model)
from fdlit.privacy import UploadPrivacy, membership_audit

MESSAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "64-true")
ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps", "tpu")
MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range


def available_accelerators() -> list[str]:
    """The ``federation.accelerator`` values this machine can run."""
    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out += ["cuda", "gpu"]
    if torch.backends.mps.is_available():
        out += ["mps"] + ([] if "gpu" in out else ["gpu"])
    if importlib.util.find_spec("torch_xla") is not None:
        out.append("tpu")
    return out


def check_accelerator(accelerator: str) -> str:
    """Refuse an unknown accelerator, or one this machine does not have, before Fabric is built."""
    here = available_accelerators()
    if accelerator not in ACCELERATORS:
        raise ConfigError("federation.accelerator", f"allowed: {', '.join(ACCELERATORS)} "
                          f"(on this machine: {', '.join(here)}); got {accelerator!r}")
    if accelerator not in here:
        raise ConfigError("federation.accelerator", f"{accelerator!r} needs a device this machine does not have; "
                          f"allowed on this machine: {', '.join(here)}")
    return accelerator


class NumericalFault(RuntimeError):
    """A client produced NaN or inf; names the client, round and phase."""


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


def augmentation_seed(seed: int, client_id: int) -> int:
    """The seed of a client's augmentation stream, independent of its batch-order stream (seeded
    ``seed * 1_000_003 + client_id``): on a CPU both are torch CPU generators, and one seed would
    make crops and flips follow the batch order's draws."""
    return int(np.random.SeedSequence([seed, client_id, 0xA06]).generate_state(1, np.uint64)[0] >> 1)


def import_client_class(path: str) -> type:
    """``federation.client_class``: a ClientModule subclass by import path."""
    module_name, _, cls_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("federation.client_class", f"cannot import {path!r} ({exc})") from None
    from fdlit.clients import ClientModule  # Lightning (seconds of CPU) only once a run is set up

    if not (isinstance(cls, type) and issubclass(cls, ClientModule)):
        raise ConfigError("federation.client_class", f"{path!r} is not a subclass of fdlit.clients.ClientModule")
    return cls


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
        executor: Optional[ClientExecutor] = None,
        accelerator: str = "auto",
        precision: str = "32-true",
        message_dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        callbacks: list[FederationCallback] = [],
        mode: Literal["fd", "local_only", "reference"] = "fd",
        client_class: str = "fdlit.clients.ClientModule",
        eval_every_n_rounds: int = 1,
        eval_subsample: Optional[int] = None,
        channels_last: bool = False,
        compile: bool = False,
        compile_backend: str = "inductor",
        participation: Participation = Participation(),
        *,
        data: Optional[FederatedData] = None,
        model: Optional[ModelSpec] = None,
        client: Optional[ClientOptimization] = None,
        aggregator: Optional[Aggregator] = None,
        privacy: Optional[UploadPrivacy] = None,
        seed: int = 0,
        server: Optional[Any] = None,
    ):
        check_at_least("federation.rounds", rounds, 1)
        for name, value in (("private_epochs_first", private_epochs_first), ("private_epochs", private_epochs),
                            ("public_epochs_first", public_epochs_first), ("public_epochs", public_epochs)):
            check_at_least(f"federation.{name}", value, 0)
        if precision not in PRECISIONS:
            raise ConfigError("federation.precision", f"allowed: {', '.join(PRECISIONS)}; got {precision!r}")
        if message_dtype not in MESSAGE_DTYPES:
            raise ConfigError("federation.message_dtype", f"allowed: {sorted(MESSAGE_DTYPES)}; got {message_dtype!r}")
        if aggregator is not None and not isinstance(aggregator, Aggregator):
            raise ConfigError("aggregator", f"must be an fdlit Aggregator, got {type(aggregator).__name__}")
        if mode not in MODES:
            raise ConfigError("federation.mode", f"allowed: {', '.join(MODES)}; got {mode!r}")
        check_accelerator(accelerator)
        if not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
            raise ConfigError("seed", f"must be an integer in [0, {MAX_SEED}], got {seed!r}")
        check_at_least("federation.eval_every_n_rounds", eval_every_n_rounds, 1)
        if eval_subsample is not None:
            check_at_least("federation.eval_subsample", eval_subsample, 1)
        self.eval_every_n_rounds, self.eval_subsample = eval_every_n_rounds, eval_subsample
        if compile:
            from torch._dynamo import list_backends

            known = list_backends(exclude_tags=())
            if compile_backend not in known:
                raise ConfigError("federation.compile_backend", f"allowed: {', '.join(known)}; got {compile_backend!r}")
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
            from fdlit.aggregators import SmoothedUncertaintyWeightedAggregator

            aggregator = SmoothedUncertaintyWeightedAggregator()
        self.aggregator = aggregator
        self.aggregator.check_config(self.model_spec, self.optimization)  # before any work
        self.privacy = privacy or UploadPrivacy()  # default: plain logits, no mechanism
        self.stop_reason: Optional[str] = None  # set when the privacy budget ends the run early
        self.seed = seed
        # no section, or one that changes nothing: the round runs the unsampled code path; the
        # reference baseline is one pooled model, so nobody is sampled there
        full = participation is None or participation.is_full or mode == "reference"
        self.participation = None if full else participation
        # fdlit.federation.server.ServerModel, or None; trained in _communicate_and_distil (fd mode)
        self.server = server if server is not None and server.enabled else None
        self.round = 0  # last completed round; 0 before round 1 (the method's set-up is "round 0")
        self.history: list[dict[str, Any]] = []
        self.ledger = CommunicationLedger()
        self.received: dict[str, torch.Tensor] = {}  # what the server broadcast at set-up
        self.wall_time = 0.0
        self._setup_started: Optional[float] = None
        self.is_setup = False

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
        if self.mode == "fd":
            self.privacy.check(self.aggregator, self.data.num_classes)
        self.fabric = make_device(self.accelerator, self.precision)
        device = self.fabric.device
        self.client_data = [reference_client(self.data, self.seed)] if self.mode == "reference" else self.data.clients
        self.clients = [
            self.client_class(self._client_network(cd.client_id), cd.client_id, cd.classes, self.optimization,
                              self.seed)
            for cd in self.client_data
        ]
        self.test_x, self.test_y = self.data.test.x.to(device), self.data.test.y.to(device)
        self.public_x, self.public_y = self.data.public.x.to(device), self.data.public.y.to(device)
        self.private = [(cd.train.x.to(device), cd.train.y.to(device)) for cd in self.client_data]
        validation = getattr(self.data, "validation", None)  # data.validation_size > 0 only
        self.val_x, self.val_y = ((validation.x.to(device), validation.y.to(device)) if validation is not None
                                  else (None, None))
        self.local_mask_matrix = torch.stack(  # M x T: test samples of each client's own classes
            [self.data.local_test_mask(cd.classes) for cd in self.client_data]).float().to(device)
        if self.participation is not None:
            self.participation.check(len(self.clients), len(self.public_x))
        self.eval_rows = self._eval_rows(len(self.test_y))
        if self.eval_rows is not None:
            self.eval_rows = self.eval_rows.to(device)
        if self.channels_last:
            for c in self.clients:
                c.model.to(memory_format=torch.channels_last)  # 4-D weights only; the rest is unchanged
        if self.executor is None:  # null: the fastest executor that applies (fdlit.execution.vectorized)
            self.executor = select_executor(self.clients, self.precision, sample=self.public_x[:1])
        self.executor.configure(self.compile_backend)
        self.executor.setup(self.fabric, self.clients)
        if self.server is not None and self.mode == "fd":  # on the driver, whatever the executor
            self.server.setup(self.data.input_shape, self.data.num_classes, self.seed, device,
                              getattr(self.data, "input_transform", None))
        self.executor.progress = self._clients_progress
        self.is_setup = True

    def _client_network(self, client_id: int) -> torch.nn.Module:
        """The client's network; the dataset's input module (uint8 -> normalised float, batched
        augmentation in training mode; fdlit.data.augment) goes first when the dataset has one."""
        net = build_model(self.model_spec, self.data.input_shape, self.data.num_classes,
                          client_id, len(self.data.clients))
        make_input = getattr(self.data, "input_transform", None)
        if make_input is None:
            return net
        from fdlit.data.augment import WithInput

        return WithInput(make_input(seed=augmentation_seed(self.seed, client_id)), net)

    def _eval_rows(self, total: int) -> Optional[torch.Tensor]:
        """The test rows of intermediate evaluations (sorted), or None for all of them. Drawn from
        a generator of its own, so the subsample changes no other random stream."""
        if self.eval_subsample is None or self.eval_subsample >= total:
            return None
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 0xE7A1)
        return torch.randperm(total, generator=g)[: self.eval_subsample].sort().values

    def evaluates(self, r: int) -> bool:
        """Whether round r evaluates the clients: round 1, every n-th round and the last."""
        return r == 1 or r % self.eval_every_n_rounds == 0 or r >= self.rounds

    def info(self, round: int, clients: tuple[int, ...] = (), public_index: Optional[torch.Tensor] = None
             ) -> FederationInfo:
        epochs = 0 if round == 0 else self.private_epochs_first if round == 1 else self.private_epochs
        public_x = self.public_x if public_index is None else self.public_x[public_index]
        return FederationInfo(round, self.seed, len(self.clients), self.data.num_classes, public_x,
                              private_epochs=epochs, clients=clients, public_index=public_index)

    def server_context(self, round: int, info: Optional[FederationInfo] = None) -> ServerContext:
        return ServerContext(info or self.info(round), self.public_y,
                             tuple(tuple(cd.classes) for cd in self.client_data))

    @property
    def sample_rate(self) -> float:
        """Per-round sampling rate q of a client (Participation.sample_rate; 1.0: everyone, every round)."""
        return 1.0 if self.participation is None else self.participation.sample_rate

    def participants(self, r: int) -> tuple[list[int], list[int], Optional[torch.Tensor]]:
        """Round r's sampled and arrived client ids and public rows (None: all); a function of
        (seed, r) only (fdlit.federation.participation)."""
        everyone = list(range(len(self.clients)))
        if self.participation is None:
            return everyone, everyone, None
        sampled, arrived = self.participation.draw(self.seed, r, len(self.clients))
        rows = self.participation.public_rows(self.seed, r, len(self.public_x))
        return sampled, arrived, None if rows is None else torch.as_tensor(rows, device=self.public_x.device)

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict[str, Any]:
        self.setup()
        started, self._setup_started = self._setup_started or time.perf_counter(), None
        start = started - self.wall_time  # a resumed run continues its wall time
        for cb in self.callbacks:
            cb.on_fit_start(self)
        try:
            if self.round == 0 and self.mode == "fd":
                self.public_warmup()
                if self.aggregator.has_setup:
                    self.method_setup()
            for r in range(self.round + 1, self.rounds + 1):
                if self.mode == "fd" and (reason := self.privacy.over_budget(r, self.sample_rate)):
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

    def method_setup(self) -> None:
        """Round 0: the method's one-off client work where the clients live, the server's set-up,
        and its broadcast; every message is counted as round 0."""
        info = self.info(0)
        raw = self.executor.client_hook("client_setup", self.aggregator, info, self.clients, self.client_data, {})
        uploads = [self._send_up(0, i, payload) for i, payload in enumerate(raw)]
        broadcast = self.aggregator.server_setup(uploads, self.server_context(0)) or {}
        for i in range(len(self.clients)):
            for kind, tensor in broadcast.items():
                self.ledger.send(0, i, "down", kind, tensor)
        self.received = dict(broadcast)
        if self.aggregator.has_receive:  # e.g. parameter exchange: every client starts from the server's model
            self.executor.client_hook("client_receive", self.aggregator, info, self.clients, self.client_data,
                                      self.received)

    def public_warmup(self) -> None:
        """Before round 1, for methods that ask (``public_warmup_epochs`` > 0, e.g. FedMD's transfer
        learning): every client trains on the labelled public set with the private loss. The
        public set is known to every party, so nothing is sent."""
        epochs = int(getattr(self.aggregator, "public_warmup_epochs", 0) or 0)
        if epochs > 0:
            losses = self.executor.train(self.clients, "private", [(self.public_x, self.public_y)] * len(self.clients),
                                         epochs, self.optimization.batch_size)
            self._check_finite(losses, 0, "public warm-up")

    def _send_up(self, r: int, client: int, payload: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # keys starting with "_" are in-process diagnostics, not messages
        return {kind: t if kind.startswith("_") else self.ledger.send(r, client, "up", kind, t)
                for kind, t in payload.items()}

    def run_round(self, r: int, clock: Optional[float] = None) -> dict[str, Any]:
        """One round of Kovalchuk et al. 2026, Algorithm 1 (docs/algorithms.md, "The round")."""
        t0 = time.perf_counter()
        first = r == 1
        for cb in self.callbacks:
            cb.on_round_start(self, r)

        # who takes part: clients not sampled do nothing this round (docs/participation.md)
        sampled, arrived, public_index = self.participants(r)
        everyone = len(sampled) == len(self.clients)
        # Stage 1 starts: private phase, evaluated; the rest of the round is _communicate_and_distil
        private_losses = []
        if sampled:
            private_losses = self.executor.train(
                self.clients if everyone else [self.clients[i] for i in sampled], "private",
                self.private if everyone else [self.private[i] for i in sampled],
                self.private_epochs_first if first else self.private_epochs, self.optimization.batch_size,
            )
        self._check_finite(private_losses, r, "private", sampled)
        # intermediate rounds: every n-th only, maybe on the test subsample; the last: all of it
        evaluated = self.evaluates(r)
        rows = self.eval_rows if r < self.rounds else None
        after_private = self.evaluate(rows) if evaluated else None
        if self.mode == "fd":
            result, public_losses, after_public = self._communicate_and_distil(r, first, evaluated, rows, arrived,
                                                                               public_index)
        else:  # baselines: no communication, no public phase (fdlit.federation.baselines)
            result, public_losses, after_public = None, [math.nan] * len(self.clients), after_private

        metrics = {"round": r}
        for phase, accs in (("after_private", after_private), ("after_public", after_public)):
            for name in ("global_acc", "local_acc"):
                if accs is None:  # not evaluated this round: NaN, and no per-client lists
                    for stat in ("mean", "min", "max"):
                        metrics[f"{phase}/{name}_{stat}"] = math.nan
                    continue
                values = accs[name]
                metrics[f"{phase}/{name}_mean"] = float(values.mean())
                metrics[f"{phase}/{name}_min"] = float(values.min())
                metrics[f"{phase}/{name}_max"] = float(values.max())
                metrics[f"clients/{phase}/{name}"] = values.tolist()
            if self.val_y is not None:  # selection without the test set (summary: selected_*)
                metrics[f"{phase}/val_acc_mean"] = math.nan if accs is None else float(accs["val_acc"].mean())
        metrics["eval/test_samples"] = (0 if not evaluated else len(self.test_y) if rows is None else len(rows))
        public_y = self.public_y if public_index is None else self.public_y[public_index]
        metrics.update(self._teacher_metrics(result, public_y))
        metrics["train/private_loss_mean"] = float(torch.tensor(private_losses).mean())
        metrics["train/public_loss_mean"] = float(torch.tensor(public_losses).mean())
        communicating = len(arrived) if self.mode == "fd" else len(self.clients)
        metrics.update(self.ledger.round_metrics(r, max(communicating, 1)))
        if self.participation is not None:
            metrics.update({"participation/clients": list(sampled), "participation/arrived": list(arrived),
                            "participation/sampled_count": len(sampled), "participation/arrived_count": len(arrived),
                            "participation/dropped_count": len(sampled) - len(arrived),
                            "participation/public_size": len(public_y)})
        metrics.update(result.stats if result is not None else {})
        metrics["time/round_s"] = time.perf_counter() - t0
        metrics.update(self.executor.timing_metrics())  # e.g. Ray actors' CPU seconds
        if self.privacy.audit and r == self.rounds:  # membership inference on the final client models
            metrics.update(membership_audit(lambda x: self.executor.predict(self.clients, x), self.private,
                                            self.test_x, self.test_y, self.local_mask_matrix))
        if result is not None and result.weights is not None:  # M x C who-to-trust matrix (public labels: diagnostic only)
            matrix = trust_matrix(result.weights, public_y, self.data.num_classes)
            if len(arrived) < len(self.clients):  # rows of clients that sent nothing this round: null
                by_client = dict(zip(arrived, matrix))
                matrix = [by_client.get(i, [None] * self.data.num_classes) for i in range(len(self.clients))]
            metrics["clients/trust_matrix"] = matrix
        self.round = r
        self.history.append(metrics)
        if clock is not None:
            self.wall_time = time.perf_counter() - clock
        for cb in self.callbacks:
            cb.on_round_end(self, r, metrics)
        return metrics

    def _communicate_and_distil(self, r: int, first: bool, evaluated: bool = True,
                                rows: Optional[torch.Tensor] = None, arrived: Optional[list[int]] = None,
                                public_index: Optional[torch.Tensor] = None):
        """The rest of a round in FD mode: public inference, client statistics and upload (end of
        Stage 1); aggregation, broadcast, public phase and its evaluation (Stage 2). ``arrived``:
        the clients whose uploads reach the server (None: all); ``public_index``: this round's
        public rows (None: all)."""
        if self.aggregator.exchange == "parameters":
            return self._exchange_parameters(r, evaluated, rows, arrived)
        everyone = arrived is None or len(arrived) == len(self.clients)
        ids = list(range(len(self.clients))) if arrived is None else list(arrived)
        if not ids:  # no upload arrived: no teacher, no public phase
            return None, [math.nan], self.evaluate(rows) if evaluated else None
        clients = self.clients if everyone else [self.clients[i] for i in ids]
        info = self.info(r, () if everyone else tuple(ids), public_index)
        public_logits = self.executor.predict(clients, info.public_x)  # M x N x C
        self._check_finite(list(public_logits), r, "public inference", ids)
        extra = self.executor.client_hook("client_upload", self.aggregator, info, clients,
                                          self.client_data if everyone else [self.client_data[i] for i in ids],
                                          self.received, public_logits)
        payloads = [{"logits": public_logits[j], **payload} for j, payload in enumerate(extra)]
        # the one place uploads are made: clipped and noised (DP), encoded, counted, decoded for the rule
        uploads, privacy_stats = self.privacy.upload(r, payloads, self.message_dtype, self.seed, self.data.num_classes,
                                                     self.sample_rate, self._send_up, ids)

        # Stage 2: server aggregates, broadcasts (to the clients it heard from), clients distil
        result = self.aggregator.aggregate(uploads, self.server_context(r, info))
        result.stats.update(privacy_stats)
        keep = result.keep
        teacher = result.teacher if keep is None else result.teacher[keep]
        public_x = info.public_x if keep is None else info.public_x[keep]
        kind = "teacher"
        if self.server is not None:  # server-side distillation from this teacher (fdlit.federation.server)
            test = None if not evaluated else (self.test_x, self.test_y) if rows is None else (
                self.test_x[rows], self.test_y[rows])
            server_teacher, server_metrics = self.server.round(first, public_x, teacher, test)
            result.stats.update(server_metrics)
            if server_teacher is not None:  # the method broadcasts the server model's predictions
                teacher, kind = server_teacher, "server_teacher"
        teacher_sent, targets = encode_teacher(teacher, self.message_dtype)
        for i in ids:
            self.ledger.send(r, i, "down", kind, teacher_sent)
            if keep is not None:
                self.ledger.send(r, i, "down", "keep_mask", keep)
        public_losses = [math.nan] * len(clients)
        if len(public_x):
            public_losses = self.executor.train(
                clients, "public", [self.aggregator.distillation_set(public_x, targets, *self.private[i]) for i in ids],
                self.public_epochs_first if first else self.public_epochs, self.optimization.public_batch_size,
            )
            self._check_finite(public_losses, r, "public", ids)
        after_public = self.evaluate(rows) if evaluated else None
        return result, public_losses, after_public

    def _exchange_parameters(self, r: int, evaluated: bool = True, rows: Optional[torch.Tensor] = None,
                             arrived: Optional[list[int]] = None):
        """The rest of a round for a parameter-exchange method: each client whose upload arrives
        (``arrived``; None: all) uploads what ``client_upload`` returns (its parameters), the server
        aggregates them, the broadcast goes down to every client and ``client_receive`` loads it; no
        public phase. Every client receives the global model, sampled or not, because FedAvg's next
        sampled clients start from it and evaluation measures it on every client. "After public"
        accuracies are those of the model every client holds after the exchange (the global model)."""
        ids = list(range(len(self.clients))) if arrived is None else list(arrived)
        everyone = len(ids) == len(self.clients)
        if not ids:  # no upload arrived: every client keeps what it has
            return None, [math.nan] * len(self.clients), self.evaluate(rows) if evaluated else None
        info = self.info(r, () if everyone else tuple(ids))
        raw = self.executor.client_hook("client_upload", self.aggregator, info,
                                        self.clients if everyone else [self.clients[i] for i in ids],
                                        self.client_data if everyone else [self.client_data[i] for i in ids],
                                        self.received)
        uploads = [self._send_up(r, ids[j], payload) for j, payload in enumerate(raw)]
        result = self.aggregator.aggregate(uploads, self.server_context(r, info))
        for i in range(len(self.clients)):
            for kind, tensor in self.aggregator.messages_to(i, len(self.clients), result.broadcast).items():
                self.ledger.send(r, i, "down", kind, tensor)
        self.executor.client_hook("client_receive", self.aggregator, self.info(r), self.clients, self.client_data,
                                  result.broadcast)
        after = self.evaluate(rows) if evaluated else None
        return result, [math.nan] * len(self.clients), after

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly (tensors and plain data)."""
        return {
            "round": self.round,
            "rounds": self.rounds,
            "seed": self.seed,
            "num_clients": len(self.clients),
            # the executor knows where client state lives (in-process, or in Ray actors)
            "clients": self.executor.fetch_states(self.clients),
            "method": self.aggregator.state_dict(),
            "privacy": self.privacy.state_dict(),  # the accountant: a resumed run reports the same epsilon
            "received": dict(self.received),
            "ledger": self.ledger.state_dict(),
            "history": [dict(m) for m in self.history],
            "wall_time": float(self.wall_time),
            "server": self.server.state_dict() if self.server is not None and self.mode == "fd" else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (after ``setup``, before ``fit``)."""
        self.setup()
        for client, client_state in zip(self.clients, state["clients"]):
            client.load_client_state(client_state)
        self.executor.push_states(self.clients)
        self.aggregator.load_state_dict(state["method"] or {})
        self.privacy.load_state_dict(state.get("privacy") or {})
        self.received = dict(state["received"])
        self.ledger.load_state_dict(state["ledger"])
        self.history = [dict(m) for m in state["history"]]
        self.round = state["round"]
        self.wall_time = state["wall_time"]
        if self.server is not None and self.mode == "fd":
            if state.get("server") is None:
                raise ValueError("the checkpoint holds no server model state, but the config has a server model")
            self.server.load_state_dict(state["server"])

    # ------------------------------------------------------------------ measurement
    def evaluate(self, rows: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        """Global accuracy (whole test set, or its ``rows``) and local accuracy (those test samples
        of the client's own classes), micro-averaged, for every client (Kovalchuk et al. 2026, App. B)."""
        x, y, masks = self.test_x, self.test_y, self.local_mask_matrix
        if rows is not None:
            x, y, masks = x[rows], y[rows], masks[:, rows]
        preds = self.executor.predict(self.clients, x).argmax(-1)  # M x T
        # micro accuracy (correct / total; torchmetrics' MulticlassAccuracy defaults to macro), for
        # all clients in one op: 80 per-client metric calls a round cost more than the predictions
        correct = (preds == y).float()
        global_acc = correct.mean(1)
        local_acc = (correct * masks).sum(1) / masks.sum(1).clamp_min(1)
        out = {"global_acc": global_acc.cpu(), "local_acc": local_acc.cpu()}
        if self.val_y is not None:  # one more predict, on the (small) validation set
            val_preds = self.executor.predict(self.clients, self.val_x).argmax(-1)
            out["val_acc"] = (val_preds == self.val_y).float().mean(1).cpu()
        return out

    def _teacher_metrics(self, result, public_y: Optional[torch.Tensor] = None) -> dict[str, float]:
        """Teacher quality against the public labels of the round's rows (diagnostic only; never
        used for training)."""
        if result is None or result.teacher is None:  # baselines, rounds where no upload arrived and
            # parameter exchange have no teacher
            return {"teacher/kept_fraction": math.nan, "teacher/acc": math.nan, "teacher/nll": math.nan}
        public_y = self.public_y if public_y is None else public_y
        p, y = result.teacher, public_y
        if result.keep is not None:
            p, y = p[result.keep], y[result.keep]
        out = {"teacher/kept_fraction": float(len(y) / len(public_y))}
        if len(y):
            out["teacher/acc"] = float((p.argmax(-1) == y).float().mean())
            out["teacher/nll"] = float(-torch.log(p.gather(1, y[:, None]).clamp_min(1e-12)).mean())
        else:
            out["teacher/acc"] = out["teacher/nll"] = math.nan
        if result.weights is not None:
            out["weights/chi"] = float(weight_concentration(result.weights))
            out["weights/entropy"] = float(weight_entropy(result.weights))
        return out

    @staticmethod
    def _server_summary(evaluated: list[dict[str, Any]]) -> dict[str, Any]:
        """Best and final server-model accuracy (only runs with a server model log ``server/acc``)."""
        rows = [m for m in evaluated if not math.isnan(m.get("server/acc", math.nan))]
        if not rows:
            return {}
        best = max(rows, key=lambda m: m["server/acc"])
        return {"server_best_acc": best["server/acc"], "server_best_round": best["round"],
                "server_final_acc": rows[-1]["server/acc"], "server_final_nll": rows[-1]["server/nll"]}

    def _check_finite(self, values, r: int, phase: str, ids: Optional[list[int]] = None) -> None:
        for i, v in enumerate(values):
            bad = not torch.isfinite(v).all() if isinstance(v, torch.Tensor) else not math.isfinite(v)
            if bad:
                raise NumericalFault(f"client {i if ids is None else ids[i]} produced NaN/inf in round {r}, "
                                     f"phase '{phase}'")

    @staticmethod
    def _selected(evaluated: list[dict[str, Any]]) -> dict[str, Any]:
        """Selection without the test set: per phase, the test accuracy of the evaluated round with
        the best mean validation accuracy (the earliest such round on a tie). Empty without a
        validation set."""
        out: dict[str, Any] = {}
        for phase, suffix in (("after_public", ""), ("after_private", "_after_private")):
            rows = [m for m in evaluated if _finite(m.get(f"{phase}/val_acc_mean"))]
            if rows:
                chosen = max(rows, key=lambda m: m[f"{phase}/val_acc_mean"])
                out[f"selected_global_acc_mean{suffix}"] = chosen[f"{phase}/global_acc_mean"]
                out[f"selected_round{suffix}"] = chosen["round"]
                out[f"selected_val_acc_mean{suffix}"] = chosen[f"{phase}/val_acc_mean"]
        return out

    def summary(self) -> dict[str, Any]:
        """Best and final numbers over the rounds that evaluated the clients (``eval/test_samples`` > 0;
        a finished run's last round always did, on the whole test set)."""
        if not self.history:
            return {}
        key = "after_public/global_acc_mean"
        evaluated = [m for m in self.history if m.get("eval/test_samples", 1) > 0] or self.history[:1]
        best = max(evaluated, key=lambda m: m[key])
        best_private = max(evaluated, key=lambda m: m["after_private/global_acc_mean"])
        # both phases are reported: Kovalchuk et al. 2026 do not say after which phase Table 1's accuracy is taken
        last = evaluated[-1]
        return {
            "rounds": self.round,
            "finished": self.round == self.rounds,
            "best_global_acc_mean": best[key],
            "best_round": best["round"],
            "best_global_acc_mean_after_private": best_private["after_private/global_acc_mean"],
            "best_round_after_private": best_private["round"],
            **self._selected(evaluated),
            "final_round": last["round"],
            "final_test_samples": last.get("eval/test_samples", len(self.test_y)),
            "best_test_samples": best.get("eval/test_samples", len(self.test_y)),
            "final_global_acc_mean": last[key],
            "final_local_acc_mean_after_private": last["after_private/local_acc_mean"],
            "final_local_acc_mean_after_public": last["after_public/local_acc_mean"],
            "final_teacher_acc": self.history[-1]["teacher/acc"],
            **self._server_summary(evaluated),
            "bytes_up_total": self.ledger.total("up"),
            "bytes_down_total": self.ledger.total("down"),
            "wall_time_s": self.wall_time,
            "client_classes": [[int(c) for c in cd.classes] for cd in self.client_data],  # the report boxes them in trust matrices
        }


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _subsample_note(summary: dict[str, Any]) -> str:
    best, full = summary.get("best_test_samples"), summary.get("final_test_samples")
    return f" [best on a test subsample of {best}]" if best and full and best < full else ""


def format_summary(summary: dict[str, Any]) -> str:
    mb = 1024**2
    return "\n".join([
        f"fdlit summary: {summary['run']}  ({summary['rounds']} rounds, {summary['wall_time_s']:.1f} s)",
        f"  best mean global accuracy : {summary['best_global_acc_mean']:.4f} after public phase (round "
        f"{summary['best_round']}), {summary['best_global_acc_mean_after_private']:.4f} after private phase "
        f"(round {summary['best_round_after_private']})" + _subsample_note(summary),
        *([f"  validation-selected       : {summary['selected_global_acc_mean']:.4f} after public phase (round "
           f"{summary['selected_round']}), {summary['selected_global_acc_mean_after_private']:.4f} after private "
           f"phase (round {summary['selected_round_after_private']})"] if "selected_global_acc_mean" in summary else []),
        f"  final mean local accuracy : {summary['final_local_acc_mean_after_private']:.4f} after private phase, "
        f"{summary['final_local_acc_mean_after_public']:.4f} after public phase",
        f"  final teacher accuracy    : {summary['final_teacher_acc']:.4f} (public labels, diagnostic)",
        *([f"  server model accuracy     : {summary['server_final_acc']:.4f} final, {summary['server_best_acc']:.4f} "
           f"best (round {summary['server_best_round']})"] if "server_final_acc" in summary else []),
        f"  bytes up / down           : {summary['bytes_up_total'] / mb:.2f} MiB / {summary['bytes_down_total'] / mb:.2f} MiB",
        f"  run directory             : {summary['run_dir']}",
    ])
