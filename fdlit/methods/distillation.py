"""Server-side distillation: a network trained on the public set against a teacher.

One loop serves the ``server`` section (fdlit.federation.server: KL(P || softmax(g(x))) from the
aggregated teacher), FedDF and FedGO as published (KL from the clients' ensemble) and F2L (its
joint loss of Eq. 9): each gives its loss on a batch's log-probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Batches:
    """How a distillation visits its rows: ``epochs`` passes in batches of ``batch_size``, shuffled by ``generator``."""

    epochs: int
    batch_size: int
    generator: torch.Generator


def distil(net: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, batches: Batches,
           loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
           before_epoch: Callable[[], None] | None = None, train_single: bool = False) -> float:
    """Train ``net`` for ``batches.epochs`` over ``x`` in batches shuffled by its generator; each step
    minimises ``loss(log_q, idx)`` (log_q: float32 log-softmax of the batch x[idx], idx: its rows).
    ``before_epoch`` runs before each epoch (it may put the network in eval mode: training mode is
    set after it). A final batch of one sample is skipped (BatchNorm cannot train on it), unless
    ``train_single`` and x has a single row. Returns the mean loss over steps (NaN: no step)."""
    n, total, steps = len(x), 0.0, 0
    epochs, batch_size, generator = batches.epochs, batches.batch_size, batches.generator
    with torch.enable_grad():
        for _ in range(epochs):
            if before_epoch is not None:
                before_epoch()
            net.train()
            order = torch.randperm(n, generator=generator).to(x.device)
            for start in range(0, n, batch_size):
                idx = order[start: start + batch_size]
                if len(idx) < 2 and not (train_single and n == 1):
                    continue
                value = loss(net(x[idx]).float().log_softmax(-1), idx)
                optimizer.zero_grad(set_to_none=True)
                value.backward()
                optimizer.step()
                total += float(value.detach())
                steps += 1
    return total / steps if steps else math.nan
