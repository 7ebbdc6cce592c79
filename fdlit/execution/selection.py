"""The automatic executor choice (``federation.executor: null``): the fastest executor that applies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch.nn.modules.conv import _ConvNd

from fdlit.execution.executor import ClientExecutor, SequentialExecutor
from fdlit.execution.grouped import GroupedNetwork
from fdlit.execution.vectorized import (
    GROUPED_PRECISIONS,
    VectorizedExecutor,
    architecture_key,
    split_input,
    unsupported_reason,
)

if TYPE_CHECKING:
    from fdlit.clients import ClientModule

# Above this many forward FLOPs per sample, one client's step already keeps a CPU busy and stacking
# does not pay: ResNet-18 on 32x32 (1.1 GFLOP) ran vectorized at 0.58x the sequential speed (5
# clients, batch 32, benchmarks/cifar10_gpu.py --device cpu). Below it, stacks are faster: MLPs
# (digits MLP, 3.4x at 20 clients under vmap, benchmarks/executors.py; now a grouped network, no vmap)
# and convolutional chains as one grouped network (LeNet-5 on Fashion-MNIST, 20 clients,
# docs/speed-and-scale.md). Not finely tuned.
CPU_MAX_FLOPS_PER_SAMPLE = 30e6
# Convolutions under vmap (networks the grouped form does not cover) on a CPU, measured as whole runs
# against the sequential executor (docs/speed-and-scale.md): digits SmallCNN, largest activation 2,048
# values per sample (32 x 8 x 8), 0.73x its CPU; LeNet-5 on 28 x 28, 4,704 (6 x 28 x 28), 1.09x and
# 1.30x. Between the two, not tuned further.
CPU_MAX_VMAP_CONV_ACTIVATION = 4096


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


def convolutions_stack_on_cpu(model: torch.nn.Module, sample: torch.Tensor, precision: str) -> bool:
    """Whether stacking pays for a network's convolutions on a CPU: True without convolutions, for
    networks the grouped form covers and pays for (LeNet-5 on Fashion-MNIST: 0.51x the sequential
    executor's CPU; BatchNorm and residual blocks included, :meth:`GroupedNetwork.pays_on`),
    and for the others (under vmap) while their largest activation per sample is at most
    ``CPU_MAX_VMAP_CONV_ACTIVATION`` values."""
    if not any(isinstance(m, _ConvNd) for m in model.modules()):
        return True
    inputs, net, _ = split_input(model)
    was_training = model.training
    model.eval()  # the input module without augmentation: no generator draws
    try:
        with torch.no_grad():
            x = sample[:1] if inputs is None else inputs(sample[:1])
            grouped = GroupedNetwork.build(net, x) if precision in GROUPED_PRECISIONS else None
            if grouped is not None and grouped.pays_on("cpu"):
                return True
            return largest_activation(net, x) <= CPU_MAX_VMAP_CONV_ACTIVATION
    finally:
        model.train(was_training)


def largest_activation(net: torch.nn.Module, x: torch.Tensor) -> int:
    """Values in the largest output of any leaf module of ``net`` on ``x`` (one sample)."""
    largest = 0

    def record(module, args, output):
        nonlocal largest
        outs = output if isinstance(output, (tuple, list)) else (output,)
        largest = max([largest, *(t.numel() for t in outs if isinstance(t, torch.Tensor))])

    handles = [m.register_forward_hook(record) for m in net.modules() if next(m.children(), None) is None]
    try:
        net(x)
    finally:
        for h in handles:
            h.remove()
    return largest


def select_executor(clients: Sequence[ClientModule], precision: str = "32-true",
                    sample: torch.Tensor | None = None) -> ClientExecutor:
    """The fastest executor that applies (``federation.executor: null``): vectorized when there are
    at least two clients, all vectorizable and all of one architecture, except on a CPU (checked when
    a ``sample`` input on the clients' device is given) for models above ``CPU_MAX_FLOPS_PER_SAMPLE``
    and for convolutional networks that would run under vmap with large activations
    (:func:`convolutions_stack_on_cpu`); sequential otherwise."""
    device = None if sample is None else sample.device.type
    vectorizable = len(clients) >= 2 and all(unsupported_reason(c, precision, device) is None for c in clients)
    if not vectorizable or len({architecture_key(c) for c in clients}) != 1:
        return SequentialExecutor()
    if device == "cpu":
        model = clients[0].model
        if forward_flops_per_sample(model, sample) > CPU_MAX_FLOPS_PER_SAMPLE:
            return SequentialExecutor()
        if not convolutions_stack_on_cpu(model, sample, precision):
            return SequentialExecutor()
    return VectorizedExecutor()
