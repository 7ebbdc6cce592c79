"""Parameters (and BatchNorm buffers) of same-architecture clients stacked per tensor, M x shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fdlit.clients import ClientModule


Stacked = list  # one M x shape tensor per parameter (or the rows being updated)


def scalar_dtype() -> torch.dtype:
    # dtype torch.optim gives a fresh "step" tensor
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def is_transposed(t: torch.Tensor) -> bool:
    """Whether t (M x out x in) is stored as the transpose of a contiguous M x in x out tensor."""
    return t.dim() == 3 and not t.is_contiguous() and t.transpose(1, 2).is_contiguous()


def transposed(t: torch.Tensor) -> torch.Tensor:
    """t (M x out x in) with the same values, stored as the transpose of a contiguous M x in x out tensor."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def select_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (dim 0) of a stacked tensor, in its own layout (``index_select`` alone returns
    a transposed stack contiguous, and a matmul on another layout rounds differently)."""
    if is_transposed(t):
        return t.transpose(1, 2).index_select(0, rows).transpose(1, 2)
    return t.index_select(0, rows)


class ParamStack:
    """Parameters of M same-shaped models stacked per parameter: ``params[k]`` is M x shape_k.

    ``gradient_layout`` (training): the weights of ``torch.nn.Linear`` layers are stored transposed
    (:func:`transposed`), the layout in which the vmapped backward returns their gradients (x^T g,
    viewed as M x out x in): the fused optimizer then reads weight, gradient and moments in one
    order without a transposing copy of every gradient (~15 % of a digits training step). Every
    other parameter is contiguous."""

    def __init__(self, clients: Sequence[ClientModule], gradient_layout: bool = False):
        self.clients = clients
        model = clients[0].model
        self.names = [n for n, _ in model.named_parameters()]
        linear = {f"{n}.weight" if n else "weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        per_client = [list(c.model.parameters()) for c in clients]
        stacked = [torch.stack([ps[k].detach() for ps in per_client]) for k in range(len(self.names))]
        # contiguous otherwise: a stack of channels-last weights would keep that layout per slice, which the
        # stacked optimizer's fused kernel (raw pointers, one layout for weights and gradients) cannot mix
        self.params = [transposed(p) if gradient_layout and name in linear and p.dim() == 3 else p.contiguous()
                       for name, p in zip(self.names, stacked, strict=True)]
        self.device, self.dtype = self.params[0].device, self.params[0].dtype
        # BatchNorm running statistics, one stacked tensor per buffer name
        self.buffers = {n: torch.stack([dict(c.model.named_buffers())[n].detach() for c in clients])
                        for n, _ in clients[0].model.named_buffers()}

    def write_back(self) -> None:
        with torch.no_grad():
            for i, c in enumerate(self.clients):
                for p, stacked in zip(c.model.parameters(), self.params, strict=True):
                    p.copy_(stacked[i])
                for n, b in c.model.named_buffers():
                    b.copy_(self.buffers[n][i])


