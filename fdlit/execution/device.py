"""The device a run's clients live on: Lightning Fabric where its precision and device handling
earn their cost, a plain stand-in for a CPU ``32-true`` run.

Importing Lightning Fabric imports ``torch._dynamo`` and torchmetrics (which imports its text
metrics' ``transformers``): about five CPU seconds, more than ten rounds of the digits default. A
CPU float32 run uses none of it (no autocast, no grad scaler, no device placement), so it gets
:class:`PlainDevice`, which has the few members of ``Fabric`` the executors call and does what
Fabric does for that case. Everything else (a GPU, MPS, TPU, mixed or 64-bit precision) still
gets ``Fabric``.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from typing import Any

import numpy as np
import torch

PLAIN_PRECISIONS = ("32-true", "32", 32)


class PlainPrecision:
    """Fabric's ``Precision`` base for ``32-true``: inputs and modules unchanged."""

    precision = "32-true"

    def forward_context(self):
        return contextlib.nullcontext()

    def convert_input(self, data: Any) -> Any:
        return data


class _Strategy:
    precision = PlainPrecision()


class _OptimizerHolder:
    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer


class PlainDevice:
    """The members of ``lightning.fabric.Fabric`` the executors use, for a CPU ``32-true`` run."""

    def __init__(self):
        self.device = torch.device("cpu")
        self.strategy = _Strategy()

    def setup(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """Fabric's ``setup`` on CPU float32: the module stays where and what it is; the optimizer
        comes back in a holder whose ``.optimizer`` is it, as Fabric's wrapper has."""
        return module, _OptimizerHolder(optimizer)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def autocast(self):
        return contextlib.nullcontext()


def is_plain(fabric: Any) -> bool:
    """True when ``fabric`` steps the raw module and optimizer: no autocast, no grad scaler
    (a :class:`PlainDevice`, or a Fabric with the plain ``32-true`` precision plugin)."""
    if isinstance(fabric, PlainDevice):
        return True
    import_lightning()
    from lightning.fabric.plugins.precision import Precision

    return type(fabric.strategy.precision) is Precision


def resolves_to_cpu(accelerator: str) -> bool:
    """Whether Fabric would put this accelerator on the CPU (``auto`` picks CUDA, then MPS)."""
    if accelerator == "cpu":
        return True
    return accelerator == "auto" and not torch.cuda.is_available() and not torch.backends.mps.is_available()


def import_lightning() -> None:
    """Lightning as fdlit imports it (fdlit.clients.lightning_import), should Fabric come first."""
    from fdlit.clients.lightning_import import import_lightning as light_import

    light_import()


def make_device(accelerator: str, precision: str, devices: Any = 1) -> Any:
    """A :class:`PlainDevice` for a CPU ``32-true`` run, else ``Fabric(accelerator, devices, precision)``
    (``devices``: ``federation.devices`` as checked by fdlit.federation.devices)."""
    if precision in PLAIN_PRECISIONS and resolves_to_cpu(accelerator):
        return PlainDevice()
    import_lightning()
    from lightning.fabric import Fabric

    return Fabric(accelerator=accelerator, devices=devices, precision=precision)


def defer_dynamo_import() -> None:
    """Let ``torch.optim`` build, zero and save optimizers, and the FLOP counter that picks the
    executor count, without importing ``torch._dynamo`` (~1.3 CPU s). Those methods are wrapped in
    ``torch._disable_dynamo``, which imports dynamo on the first call only to wrap the method so
    that a compiled region skips it, and caches the wrapped method on the function. Outside
    compilation that wrapper calls the method unchanged, so the cache is filled with the method
    itself. Only for a run that compiles nothing: ``torch.compile`` imports dynamo anyway."""
    if "torch._dynamo" in sys.modules:
        return
    from torch.utils.flop_counter import _FlopCounterMode

    methods = [getattr(torch.optim.Optimizer, name) for name in ("add_param_group", "zero_grad", "state_dict",
                                                                   "load_state_dict")]
    for method in [*methods, _FlopCounterMode.__torch_dispatch__]:
        fn = getattr(method, "__wrapped__", None)  # the undecorated method (functools.wraps)
        if fn is not None and getattr(fn, "__dynamo_disable", None) is None:
            fn.__dynamo_disable = fn


def seed_everything(seed: int) -> None:
    """Lightning's ``seed_everything(seed, workers=False)``: Python's, NumPy's and torch's global
    generators (CUDA's included), and ``PL_GLOBAL_SEED`` for anything that reads it."""
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    os.environ["PL_SEED_WORKERS"] = "0"
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
