"""The vectorized executor's batches for a whole phase: the sequential executor's batch order and
boundaries as padded index tensors, and the vmapped calls each step makes."""

from __future__ import annotations

import torch

from fdlit.data.augment import ImageInput


def batch_plan(clients, sizes, offsets, epochs: int, batch_size: int, width: int | None = None):
    """Batches of every client for a whole phase as padded tensors.

    Consumes each client's generator exactly like ``SequentialExecutor._train_one`` (one
    ``randperm(n)`` per epoch) and keeps its batch boundaries, including skipping a final batch of
    one sample. Returns index (S x M x W, global rows of the concatenated data), weight (S x M x W,
    1 for real samples, 0 for padding) and the number of steps of each client (M).
    """
    width = width or max(1, min(batch_size, max(sizes)))
    plans = []
    for c, n, off in zip(clients, sizes, offsets, strict=True):
        rows_idx, rows_w = [], []
        for _ in range(epochs):
            order = torch.randperm(n, generator=c.generator)
            nb = -(-n // batch_size)
            pad = nb * width - n
            idx = torch.cat([order, order[:1].expand(pad)]).view(nb, width)  # padding: a real sample
            w = torch.cat([torch.ones(n), torch.zeros(pad)]).view(nb, width)
            if n > 1 and n % batch_size == 1:  # final batch of one sample: skipped
                idx, w = idx[:-1], w[:-1]
            rows_idx.append(idx + off)
            rows_w.append(w)
        plans.append((torch.cat(rows_idx), torch.cat(rows_w)))
    counts = torch.tensor([len(p[0]) for p in plans])
    steps = int(counts.max()) if len(plans) else 0
    index = torch.zeros(steps, len(plans), width, dtype=torch.long)
    weight = torch.zeros(steps, len(plans), width)
    for j, (idx, w) in enumerate(plans):
        index[: len(idx), j] = idx
        weight[: len(w), j] = w
    return index, weight, counts


def step_calls(counts: torch.Tensor, lengths: torch.Tensor, batch_dependent: bool, width: int):
    """Per step, the vmapped calls to make: (rows or None for all clients, batch width).

    Clients that ran out of batches are left out. Without batch-dependent layers one call covers
    every active client (short batches are zero-weight padded to the plan's ``width``). With
    BatchNorm, padding would enter the batch statistics, so active clients are split by their batch
    length and nothing is padded.
    """
    m = len(counts)
    for s in range(lengths.shape[0]):
        active = counts > s
        if not batch_dependent:
            yield [(None if bool(active.all()) else active.nonzero().squeeze(1), width)]
            continue
        out = []
        for length in lengths[s][active].unique().tolist():
            rows = (active & (lengths[s] == length)).nonzero().squeeze(1)
            out.append((None if len(rows) == m else rows, int(length)))
        yield out


def client_inputs(modules, x_all: torch.Tensor, idx: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Each client's input module on its own batch (real samples only, so its augmentation
    generator draws exactly what it draws in the sequential executor); zero-weight padding rows
    repeat the first sample."""
    out = []
    for module, rows, n in zip(modules, idx, lengths, strict=True):
        y = module(x_all[rows[:n]])
        if n < len(rows):
            y = torch.cat([y, y[:1].expand(len(rows) - n, *y.shape[1:])])
        out.append(y)
    return torch.stack(out)



def shared_input(inputs) -> ImageInput | None:
    """The input module of every client when it draws nothing at random (no augmentation) and all
    clients' are alike; the phase then transforms its inputs once instead of per client and step
    (the same elementwise operations on the same values, so the same bits)."""
    first = inputs[0] if inputs else None
    if not isinstance(first, ImageInput) or first.augment:
        return None
    for other in inputs[1:]:
        if (type(other) is not type(first) or other.augment or not torch.equal(other.mean, first.mean)
                or not torch.equal(other.std, first.std)):
            return None
    return first
