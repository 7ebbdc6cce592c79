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
from typing import Any, Callable, Literal, Optional, Union

import lightning as L
import numpy as np
import torch
from lightning.fabric import Fabric

from fdlit.aggregators.base import Aggregator, FederationInfo, ServerContext, weight_concentration, weight_entropy
from fdlit.callbacks import FederationCallback
from fdlit.clients import ClientModule, ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError, check_at_least
from fdlit.federation.baselines import MODES, reference_client
from fdlit.federation.communication import CommunicationLedger
from fdlit.federation.diagnostics import trust_matrix
from fdlit.execution import ClientExecutor, select_executor

MESSAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "64-true")
ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps", "tpu")
MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range
ModelSpec = Union[dict, Callable[..., torch.nn.Module]]


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


def build_model(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int,
                client_id: int = 0, num_clients: int = 1) -> torch.nn.Module:
    """Instantiate a client network from ``{"class_path": ..., "init_args": {...}}`` or a callable.

    ``input_shape`` and ``num_classes`` come from the data unless the config sets them. A
    ``fdlit.models.PerClient`` spec (heterogeneous federation) is resolved to client ``client_id``'s group.
    """
    if callable(spec):
        return spec(input_shape=input_shape, num_classes=num_classes)
    class_path = spec["class_path"]
    module_name, _, cls_name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("model.class_path", f"cannot import {class_path!r} ({exc})") from None
    kwargs = dict(spec.get("init_args") or {})
    from fdlit.models.hetero import PerClient

    if isinstance(cls, type) and issubclass(cls, PerClient):
        own = PerClient.assign(kwargs.get("groups") or [], num_clients)[client_id]
        return build_model(own, input_shape, num_classes)
    kwargs["input_shape"] = tuple(kwargs.get("input_shape") or input_shape)
    kwargs["num_classes"] = kwargs.get("num_classes") or num_classes
    return cls(**kwargs)


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


def import_client_class(path: str) -> type[ClientModule]:
    """``federation.client_class``: a ClientModule subclass by import path."""
    module_name, _, cls_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("federation.client_class", f"cannot import {path!r} ({exc})") from None
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
        *,
        data: Optional[FederatedData] = None,
        model: Optional[ModelSpec] = None,
        client: Optional[ClientOptimization] = None,
        aggregator: Optional[Aggregator] = None,
        seed: int = 0,
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
        self.seed = seed
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
        L.seed_everything(self.seed, verbose=False)
        if not self.data.is_setup:
            self.data.setup(self.seed)
        self.fabric = Fabric(accelerator=self.accelerator, devices=1, precision=self.precision)
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
        self.local_mask_matrix = torch.stack(  # M x T: test samples of each client's own classes
            [self.data.local_test_mask(cd.classes) for cd in self.client_data]).float().to(device)
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

    def info(self, round: int) -> FederationInfo:
        return FederationInfo(round, self.seed, len(self.clients), self.data.num_classes, self.public_x)

    def server_context(self, round: int) -> ServerContext:
        return ServerContext(self.info(round), self.public_y, tuple(tuple(cd.classes) for cd in self.client_data))

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict[str, Any]:
        self.setup()
        started, self._setup_started = self._setup_started or time.perf_counter(), None
        start = started - self.wall_time  # a resumed run continues its wall time
        for cb in self.callbacks:
            cb.on_fit_start(self)
        try:
            if self.round == 0 and self.mode == "fd" and self.aggregator.has_setup:
                self.method_setup()
            for r in range(self.round + 1, self.rounds + 1):
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

        # Stage 1 starts: private phase, evaluated; the rest of the round is _communicate_and_distil
        private_losses = self.executor.train(
            self.clients, "private", self.private,
            self.private_epochs_first if first else self.private_epochs, self.optimization.batch_size,
        )
        self._check_finite(private_losses, r, "private")
        # intermediate rounds: every n-th only, maybe on the test subsample; the last: all of it
        evaluated = self.evaluates(r)
        rows = self.eval_rows if r < self.rounds else None
        after_private = self.evaluate(rows) if evaluated else None
        if self.mode == "fd":
            result, public_losses, after_public = self._communicate_and_distil(r, first, evaluated, rows)
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
        metrics["eval/test_samples"] = (0 if not evaluated else len(self.test_y) if rows is None else len(rows))
        metrics.update(self._teacher_metrics(result))
        metrics["train/private_loss_mean"] = float(torch.tensor(private_losses).mean())
        metrics["train/public_loss_mean"] = float(torch.tensor(public_losses).mean())
        metrics.update(self.ledger.round_metrics(r, len(self.clients)))
        metrics.update(result.stats if result is not None else {})
        metrics["time/round_s"] = time.perf_counter() - t0
        if result is not None and result.weights is not None:  # M x C who-to-trust matrix (public labels: diagnostic only)
            metrics["clients/trust_matrix"] = trust_matrix(result.weights, self.public_y, self.data.num_classes)
        self.round = r
        self.history.append(metrics)
        if clock is not None:
            self.wall_time = time.perf_counter() - clock
        for cb in self.callbacks:
            cb.on_round_end(self, r, metrics)
        return metrics

    def _communicate_and_distil(self, r: int, first: bool, evaluated: bool = True,
                                rows: Optional[torch.Tensor] = None):
        """The rest of a round in FD mode: public inference, client statistics and upload (end of
        Stage 1); aggregation, broadcast, public phase and its evaluation (Stage 2)."""
        public_logits = self.executor.predict(self.clients, self.public_x)  # M x N x C
        self._check_finite(list(public_logits), r, "public inference")
        info = self.info(r)
        extra = self.executor.client_hook("client_upload", self.aggregator, info, self.clients, self.client_data,
                                          self.received, public_logits)
        uploads = []
        for i, payload in enumerate(extra):
            payload = {"logits": public_logits[i], **payload}
            payload["logits"] = payload["logits"].to(self.message_dtype)
            uploads.append(self._send_up(r, i, payload))

        # Stage 2: server aggregates, broadcasts, clients distil
        result = self.aggregator.aggregate(uploads, self.server_context(r))
        keep = result.keep
        teacher = result.teacher if keep is None else result.teacher[keep]
        teacher_sent, targets = encode_teacher(teacher, self.message_dtype)
        for i in range(len(self.clients)):
            self.ledger.send(r, i, "down", "teacher", teacher_sent)
            if keep is not None:
                self.ledger.send(r, i, "down", "keep_mask", keep)
        public_x = self.public_x if keep is None else self.public_x[keep]
        public_losses = [math.nan] * len(self.clients)
        if len(public_x):
            public_losses = self.executor.train(
                self.clients, "public", [(public_x, targets)] * len(self.clients),
                self.public_epochs_first if first else self.public_epochs, self.optimization.public_batch_size,
            )
            self._check_finite(public_losses, r, "public")
        after_public = self.evaluate(rows) if evaluated else None
        return result, public_losses, after_public

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
            "received": dict(self.received),
            "ledger": self.ledger.state_dict(),
            "history": [dict(m) for m in self.history],
            "wall_time": float(self.wall_time),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (after ``setup``, before ``fit``)."""
        self.setup()
        for client, client_state in zip(self.clients, state["clients"]):
            client.load_client_state(client_state)
        self.executor.push_states(self.clients)
        self.aggregator.load_state_dict(state["method"] or {})
        self.received = dict(state["received"])
        self.ledger.load_state_dict(state["ledger"])
        self.history = [dict(m) for m in state["history"]]
        self.round = state["round"]
        self.wall_time = state["wall_time"]

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
        return {"global_acc": global_acc.cpu(), "local_acc": local_acc.cpu()}

    def _teacher_metrics(self, result) -> dict[str, float]:
        """Teacher quality against the public labels (diagnostic only; never used for training)."""
        if result is None:  # baselines have no teacher
            return {"teacher/kept_fraction": math.nan, "teacher/acc": math.nan, "teacher/nll": math.nan}
        p, y = result.teacher, self.public_y
        if result.keep is not None:
            p, y = p[result.keep], y[result.keep]
        out = {"teacher/kept_fraction": float(len(y) / len(self.public_y))}
        if len(y):
            out["teacher/acc"] = float((p.argmax(-1) == y).float().mean())
            out["teacher/nll"] = float(-torch.log(p.gather(1, y[:, None]).clamp_min(1e-12)).mean())
        else:
            out["teacher/acc"] = out["teacher/nll"] = math.nan
        if result.weights is not None:
            out["weights/chi"] = float(weight_concentration(result.weights))
            out["weights/entropy"] = float(weight_entropy(result.weights))
        return out

    def _check_finite(self, values, r: int, phase: str) -> None:
        for i, v in enumerate(values):
            bad = not torch.isfinite(v).all() if isinstance(v, torch.Tensor) else not math.isfinite(v)
            if bad:
                raise NumericalFault(f"client {i} produced NaN/inf in round {r}, phase '{phase}'")

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
            "final_round": last["round"],
            "final_test_samples": last.get("eval/test_samples", len(self.test_y)),
            "best_test_samples": best.get("eval/test_samples", len(self.test_y)),
            "final_global_acc_mean": last[key],
            "final_local_acc_mean_after_private": last["after_private/local_acc_mean"],
            "final_local_acc_mean_after_public": last["after_public/local_acc_mean"],
            "final_teacher_acc": self.history[-1]["teacher/acc"],
            "bytes_up_total": self.ledger.total("up"),
            "bytes_down_total": self.ledger.total("down"),
            "wall_time_s": self.wall_time,
        }


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
        f"  final mean local accuracy : {summary['final_local_acc_mean_after_private']:.4f} after private phase, "
        f"{summary['final_local_acc_mean_after_public']:.4f} after public phase",
        f"  final teacher accuracy    : {summary['final_teacher_acc']:.4f} (public labels, diagnostic)",
        f"  bytes up / down           : {summary['bytes_up_total'] / mb:.2f} MiB / {summary['bytes_down_total'] / mb:.2f} MiB",
        f"  run directory             : {summary['run_dir']}",
    ])
