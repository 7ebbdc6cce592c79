"""Baselines run by the same loop, logged the same way (``federation.mode``).

* ``fd`` — federated distillation, Kovalchuk et al. 2026, Algorithm 1 (default).
* ``local_only`` — "without communication" (Kovalchuk et al. 2026, Sec. 5.2): every client runs only
  its private phase each round; nothing is uploaded or broadcast (0 bytes), no public phase.
  "after_public" metrics equal "after_private" ones so summaries and plots line up with FD runs.
* ``reference`` — the fully-informed reference (Kovalchuk et al. 2025 (workshop), Sec. 4;
  Kovalchuk et al. 2026, Table 1 "Ref."): ONE model of the configured architecture, trained with
  labels on all classes with |D_pub| + |D_i| samples: the whole public set (with its labels) plus
  |D_i| samples drawn uniformly from the private pool. **choice**: |D_i| = the mean number of samples
  a client trains on (its private data minus its calibration split). Its "round" r is the
  private-phase schedule of the FD run (first-round epochs, then later epochs), evaluated after each,
  so curves share the x-axis; local accuracy equals global accuracy (it holds every class).
"""

from __future__ import annotations

import numpy as np
import torch

from fdlit.data import ClientData, FederatedData, TensorDataset
from fdlit.methods.base import Aggregator

MODES = ("fd", "local_only", "reference")


def reference_client(data: FederatedData, seed: int) -> ClientData:
    n_private = int(round(np.mean([len(cd.train) for cd in data.clients])))
    rng = np.random.default_rng([seed, 0x5EF])
    draw = np.sort(rng.choice(len(data.pool), size=min(n_private, len(data.pool)), replace=False))
    pool_part = data.pool.subset(torch.from_numpy(draw))
    train = TensorDataset(
        torch.cat([data.public.x, pool_part.x]), torch.cat([data.public.y, pool_part.y]),
        data.num_classes, "reference/train", data.public.input_transform,
    )
    classes = sorted(int(c) for c in torch.unique(train.y))
    return ClientData(0, classes, train, train.subset(torch.arange(min(2, len(train)))), draw)


def measured_network(mode: str, method: Aggregator) -> str:
    """Whose accuracy a run of ``mode`` reports: the method's network in ``fd``, the clients' own without
    communication, the one model of the reference."""
    if mode == "reference":
        return "one model trained on every class (the reference)"
    return method.measured_network if mode == "fd" else "each client's own network"
