"""Device memory of a stack of clients, and how many clients fit in one stack on a CUDA device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fdlit.clients import ClientModule


def client_memory_bytes(client: ClientModule, batch: torch.Tensor) -> int:
    """Rough device memory one client takes in a vmapped training step: its parameters four times
    (weights, gradients, two Adam moments) plus activations, taken as twice the bytes of every
    leaf module's output on ``batch`` (kept for backward, and their gradients). Measured with one
    forward pass in eval mode (no BatchNorm update, no augmentation draw)."""
    model = client.model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    activations = 0

    def count(module, inputs, output):
        nonlocal activations
        outs = output if isinstance(output, (tuple, list)) else (output,)
        activations += sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))

    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    handles = [m.register_forward_hook(count) for m in leaves]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(batch)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return 4 * params + 2 * activations


def free_device_memory(device: torch.device) -> int:
    """Bytes a new stack can use on a CUDA device: what the driver reports free plus what PyTorch's
    caching allocator holds but no tensor uses. The driver's figure alone counts the cache of an
    earlier phase as taken (on an H100 with 100 ResNet-18 clients, the driver's figure alone gave
    stacks of 26 clients for one phase and of 1 for another)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def auto_chunk_size(free_bytes: int, per_client_bytes: int, fraction: float = 0.7) -> int:
    """Clients per vmapped step that fit in ``fraction`` of the free device memory (at least 1);
    the rest is left for the allocator's fragmentation and what the round keeps on the device."""
    return max(1, int(free_bytes * fraction) // max(1, per_client_bytes))

