"""Truncated-SVD compression of a network update, as FedKD sends it (Wu et al. 2022).

Every exchanged tensor t of the network (parameters, then floating-point buffers, in
``exchanged_tensors`` order) is viewed as a matrix A of rows x cols = shape[0] x (numel / shape[0]).
A tensor with at least two dimensions and rows, cols > 1 is sent as its truncated SVD
A ~ U_k diag(s_k) V_k^T, keeping the k largest singular values that hold an energy share T:

    k = min{ j >= 1 : sum_{i <= j} s_i^2 >= T * sum_i s_i^2 }      (k = 0 when A = 0),

U_k (rows x k), s_k (k) and V_k^T (k x cols) in float32; every other tensor (biases, vectors) is
sent as it is. What travels is two arrays: ``factors``, the concatenation of every tensor's
(U_k, s_k, V_k^T) or its numbers, in order, and ``ranks`` (int32, the k of every compressed
tensor, in order), so the bytes counted are exactly those of the factors sent. The receiver knows
the matrix shapes (sent once at set-up, ``matrix_shapes``: int32, one (rows, cols) per tensor).
"""

from __future__ import annotations

import torch


def matrix_shapes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """(rows, cols) of every tensor's matrix view, int32 (T x 2); a vector is 1 x numel."""
    rows = [t.shape[0] if t.dim() >= 2 else 1 for t in tensors]
    return torch.tensor([[r, t.numel() // max(r, 1)] for r, t in zip(rows, tensors, strict=True)], dtype=torch.int32)


def compressible(rows: int, cols: int) -> bool:
    return rows > 1 and cols > 1


def kept_rank(singular: torch.Tensor, energy: float) -> int:
    """The fewest leading singular values whose squares hold ``energy`` of the total (0 for a zero matrix)."""
    cumulative = singular.double().pow(2).cumsum(0)
    total = cumulative[-1]
    if total <= 0:
        return 0
    return min(int((cumulative < energy * total).sum()) + 1, len(singular))


def compress(flat: torch.Tensor, shapes: torch.Tensor, energy: float) -> dict[str, torch.Tensor]:
    """``flat`` (every tensor's numbers, concatenated) as ``factors`` and ``ranks`` (module docstring)."""
    pieces, ranks, offset = [], [], 0
    for rows, cols in shapes.tolist():
        block = flat[offset : offset + rows * cols].double()
        offset += rows * cols
        if not compressible(rows, cols):
            pieces.append(block.float())
            continue
        u, s, vh = torch.linalg.svd(block.view(rows, cols), full_matrices=False)
        k = kept_rank(s, energy)
        ranks.append(k)
        pieces += [u[:, :k].reshape(-1).float(), s[:k].float(), vh[:k].reshape(-1).float()]
    factors = torch.cat(pieces) if pieces else torch.zeros(0)
    return {"factors": factors, "ranks": torch.tensor(ranks, dtype=torch.int32)}


def decompress(factors: torch.Tensor, ranks: torch.Tensor, shapes: torch.Tensor) -> torch.Tensor:
    """The flat update ``factors`` and ``ranks`` encode: U_k diag(s_k) V_k^T per compressed tensor."""
    out, offset, ranked = [], 0, iter(ranks.tolist())
    factors = factors.float()
    for rows, cols in shapes.tolist():
        if not compressible(rows, cols):
            out.append(factors[offset : offset + rows * cols])
            offset += rows * cols
            continue
        k = next(ranked)
        u = factors[offset : offset + rows * k].view(rows, k)
        s = factors[offset + rows * k : offset + rows * k + k]
        vh = factors[offset + rows * k + k : offset + rows * k + k + k * cols].view(k, cols)
        offset += rows * k + k + k * cols
        out.append(((u * s) @ vh).reshape(-1))
    return torch.cat(out) if out else torch.zeros(0)


def factor_numbers(ranks: list[int], shapes: torch.Tensor) -> int:
    """How many numbers ``factors`` holds for these ranks: sum of (rows + 1 + cols) k over the
    compressed tensors plus every other tensor's numel."""
    ranked, total = iter(ranks), 0
    for rows, cols in shapes.tolist():
        total += (rows + 1 + cols) * next(ranked) if compressible(rows, cols) else rows * cols
    return total
