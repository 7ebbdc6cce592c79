"""Who-to-trust matrix (docs/algorithms.md "Diagnostics from the theory"): the mean weight each client
receives on the public samples of each true class, M x C. Uses public labels: diagnostic only."""

from __future__ import annotations

import torch


def trust_matrix(weights: torch.Tensor, labels: torch.Tensor, num_classes: int) -> list[list[float | None]]:
    """``weights`` M x N (columns sum to 1), ``labels`` N true public labels -> nested M x C list.

    A class with no public sample has no mean: its column is None (JSON null), never a made-up 0.
    """
    w = weights.detach().double().cpu()
    y = labels.detach().long().cpu()
    onehot = torch.nn.functional.one_hot(y, num_classes).double()  # N x C
    counts = onehot.sum(0)  # samples per class
    means = (w @ onehot) / counts.clamp_min(1)  # M x C
    return [[float(v) if counts[c] > 0 else None for c, v in enumerate(row)] for row in means]
