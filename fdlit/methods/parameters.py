"""A network's parameters as one flat vector: what parameter exchange sends and loads, and what a
proximal or correction term reads. Shared by the parameter-exchange methods and the attacks on them."""

from __future__ import annotations

import torch


def exchanged_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """What parameter exchange sends: every parameter, then every floating-point buffer."""
    return [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]


def flatten(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def load_flat(tensors, flat: torch.Tensor) -> None:
    """Copy ``flat`` into ``tensors`` in place (the optimizer keeps referring to the same tensors)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def parameter_slices(model: torch.nn.Module, flat: torch.Tensor):
    """(parameter, its slice of ``flat`` shaped like it) over ``model.parameters()``. Read from the
    module, so under the vectorized executor's ``functional_call`` they are each client's own."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        yield p, flat[offset : offset + n].view_as(p)
        offset += n
