"""The automatic executor choice (``federation.executor: null``): the fastest executor that applies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from fdlit.execution.executor import ClientExecutor, SequentialExecutor
from fdlit.execution.vectorized import VectorizedExecutor, architecture_key, unsupported_reason

if TYPE_CHECKING:
    from fdlit.clients import ClientModule

# Above this many forward FLOPs per sample, one client's step already keeps a CPU busy and vmap's
# batched (grouped) convolutions are slower than one client at a time. Measured on the 2-core CPU
# machine (benchmarks/executors.py, benchmarks/cifar10_gpu.py --device cpu): digits SmallCNN,
# 0.7 MFLOP, vectorized 1.48x faster (20 clients); ResNet-18 on 32x32, 1.1 GFLOP, vectorized 0.58x
# (5 clients, batch 32). The threshold sits between the two; it is not finely tuned.
CPU_MAX_FLOPS_PER_SAMPLE = 30e6


def forward_flops_per_sample(model: torch.nn.Module, sample: torch.Tensor) -> float:
    """Forward FLOPs of ``model`` on one sample (eval mode: no BatchNorm update, no augmentation)."""
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(sample[:1])
    finally:
        model.train(was_training)
    return float(counter.get_total_flops())


def select_executor(clients: Sequence[ClientModule], precision: str = "32-true",
                    sample: torch.Tensor | None = None) -> ClientExecutor:
    """The fastest executor that applies (``federation.executor: null``): vectorized when there are
    at least two clients, all vectorizable and all of one architecture, except on a CPU for models
    above ``CPU_MAX_FLOPS_PER_SAMPLE`` (checked when a ``sample`` input on the clients' device is
    given); sequential otherwise."""
    device = None if sample is None else sample.device.type
    vectorizable = len(clients) >= 2 and all(unsupported_reason(c, precision, device) is None for c in clients)
    if not vectorizable or len({architecture_key(c) for c in clients}) != 1:
        return SequentialExecutor()
    on_cpu = sample is not None and sample.device.type == "cpu"
    if on_cpu and forward_flops_per_sample(clients[0].model, sample) > CPU_MAX_FLOPS_PER_SAMPLE:
        return SequentialExecutor()
    return VectorizedExecutor()


