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


class ParamStack:
    """Parameters of M same-shaped models stacked per parameter: ``params[k]`` is M x shape_k."""

    def __init__(self, clients: Sequence[ClientModule]):
        self.clients = clients
        self.names = [n for n, _ in clients[0].model.named_parameters()]
        per_client = [list(c.model.parameters()) for c in clients]
        # contiguous: a stack of channels-last weights would keep that layout per slice, which the
        # stacked optimizer's fused kernel (raw pointers, one layout for weights and gradients) cannot mix
        self.params = [torch.stack([ps[k].detach() for ps in per_client]).contiguous() for k in range(len(self.names))]
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


