"""The ``federation`` section: how the rounds run (schedule, device, executor, evaluation, participation).

One object, checked field by field before any data loads; :class:`~fdlit.federation.loop.FederationLoop`
takes it beside the other config sections.
"""

from __future__ import annotations

from typing import Literal

import torch

from fdlit.callbacks import FederationCallback
from fdlit.errors import ConfigError
from fdlit.execution import ClientExecutor
from fdlit.federation.baselines import MODES
from fdlit.federation.clock.base import VirtualClock
from fdlit.federation.construction import (
    MESSAGE_DTYPES,
    PRECISIONS,
    check_compilation,
    check_loop_settings,
    import_client_class,
    use_cuda_graphs,
)
from fdlit.federation.devices import Devices, check_devices
from fdlit.federation.participation import Participation


class FederationSettings:
    """How a federation runs its rounds.

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
        precision: Lightning precision: ``32-true``, ``bf16-mixed``, ``bf16-true`` (weights, gradients
            and optimizer state in bf16), ``16-mixed`` or ``64-true``.
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
            uses the whole test set, and so do the validation-selected numbers (the selected
            round's weights are kept and measured in full after the last round:
            fdlit.federation.selection). null: the whole test set every time. At most the test
            set's size (checked once the data is set up).
        eval_after_private: evaluate the clients after the private phase too (``after_private/*``, the
            after-private selection and report columns); false: only after the exchange, about half the
            evaluation's cost (its metrics are then NaN, as in a round not evaluated).
        channels_last: store every client network's 4-D weights channels-last
            (``torch.channels_last``; convolutions then run in NHWC, usually faster on GPUs with
            tensor cores). Same results up to float rounding.
        compile: compile the training computation with ``torch.compile``: the sequential executor
            compiles each client network's forward, the vectorized executor its vmapped training
            step (once per architecture and phase). The first steps pay the compilation. Not
            available with the Ray executor.
        compile_backend: the ``torch.compile`` backend (``inductor``, the default compiler; e.g.
            ``aot_eager`` to check a model traces without generating code).
        cuda_graphs: capture the vectorized executor's grouped training step (forward, losses,
            backward and the fused Adam update) once per phase as a CUDA graph and replay it at every
            full-width step (:mod:`fdlit.execution.graph_step`): one launch instead of hundreds of
            kernels a step, the same arithmetic. CUDA only, not with ``compile``.
        participation: client sampling, dropout, late joiners and a per-round public subset
            (:class:`~fdlit.federation.participation.Participation`, docs/participation.md). Unset:
            every client and the whole public set every round (the default).
        clock: rounds on a virtual clock (:mod:`fdlit.federation.clock`, docs/async.md):
            ``SynchronousClock`` (time, an optional deadline) or ``AsynchronousClock`` (a buffer or
            period of arrivals, staleness-weighted cached predictions; FedBuff or FedAsync for a
            parameter exchange). null: no clock (the default).
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
        eval_after_private: bool = True,
        channels_last: bool = False,
        compile: bool = False,
        compile_backend: str = "inductor",
        cuda_graphs: bool = False,
        participation: Participation = Participation(),
        clock: VirtualClock | None = None,
    ):
        check_loop_settings(
            rounds=rounds, accelerator=accelerator, eval_every_n_rounds=eval_every_n_rounds,
            eval_subsample=eval_subsample,
            choices={"precision": (precision, PRECISIONS), "message_dtype": (message_dtype, sorted(MESSAGE_DTYPES)),
                     "mode": (mode, MODES)},
            epochs={"private_epochs_first": private_epochs_first, "private_epochs": private_epochs,
                    "public_epochs_first": public_epochs_first, "public_epochs": public_epochs})
        check_compilation(accelerator, compile, compile_backend, cuda_graphs)
        self.rounds, self.mode = rounds, mode
        self.private_epochs_first, self.private_epochs = private_epochs_first, private_epochs
        self.public_epochs_first, self.public_epochs = public_epochs_first, public_epochs
        self.executor = executor  # null: chosen in set-up, once the clients exist
        self.accelerator, self.precision = accelerator, precision
        self.fabric_devices = check_devices(accelerator, devices)
        self.message_dtype: torch.dtype = MESSAGE_DTYPES[message_dtype]
        self.callbacks = list(callbacks)
        self.client_class = import_client_class(client_class)
        self.eval_every_n_rounds, self.eval_subsample = eval_every_n_rounds, eval_subsample
        self.eval_after_private = bool(eval_after_private)
        self.channels_last = channels_last
        self.compile_backend = compile_backend if compile else None
        self.cuda_graphs = cuda_graphs
        if cuda_graphs and executor is not None:
            use_cuda_graphs(executor)
        # no section, or one that changes nothing: the round runs the unsampled code path; the
        # reference baseline is one pooled model, so nobody is sampled there
        full = participation is None or participation.is_full or mode == "reference"
        self.participation = None if full else participation
        self.clock = clock

    def check_test_set(self, test_size: int) -> None:
        """The bound that needs the data: a subsample larger than the test set would silently be the
        whole set (called once the data is set up, before any training)."""
        if self.eval_subsample is not None and self.eval_subsample > test_size:
            raise ConfigError("federation.eval_subsample", f"allowed: an integer in [1, {test_size}] (the test set's "
                              f"size) or null (the whole test set); got {self.eval_subsample}")

    def private_epochs_of(self, r: int) -> int:
        return self.private_epochs_first if r == 1 else self.private_epochs

    def public_epochs_of(self, r: int) -> int:
        return self.public_epochs_first if r == 1 else self.public_epochs
