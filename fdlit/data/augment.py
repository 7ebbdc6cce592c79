"""Batched image input pipeline on the training device.

Images are stored as uint8 tensors on the device. :class:`ImageInput` is the first layer of every
client network on an image dataset (the loop prepends it, see ``FederationLoop.setup``): it turns a
uint8 batch into normalised float32 and, in training mode only, applies the standard CIFAR
augmentation (random crop of the zero-padded image, horizontal flip) to the whole batch at once —
no PIL, no per-sample work, no DataLoader workers. Because it lives in the model, every code path
that calls the model (private/public training, public inference, calibration logits, evaluation)
sees the same normalisation, and evaluation (``eval()`` mode) is never augmented.

Randomness: each ImageInput owns a generator on the input's device, seeded from the client's seed,
so augmentation is reproducible per client and independent of other clients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def random_crop_flip(x: torch.Tensor, padding: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random ``padding``-pixel translation (zero padding, i.e. crop of the padded image) + horizontal
    flip with probability 1/2, per sample, batched; works on any dtype, on x's device."""
    n, _, h, w = x.shape
    dev = x.device
    if padding > 0:
        padded = nn.functional.pad(x, (padding,) * 4)
        dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=dev)
        dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=dev)
        rows = dy[:, None] + torch.arange(h, device=dev)[None, :]
        cols = dx[:, None] + torch.arange(w, device=dev)[None, :]
    else:
        padded = x
        rows = torch.arange(h, device=dev).expand(n, h)
        cols = torch.arange(w, device=dev).expand(n, w)
    flip = torch.rand(n, generator=generator, device=dev) < 0.5
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    idx_n = torch.arange(n, device=dev)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx_n, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


class ImageInput(nn.Module):
    """uint8 (or float in [0, 1]) images -> normalised float; CIFAR augmentation while training.

    Args:
        mean, std: per-channel statistics applied after scaling to [0, 1].
        augment: random crop with ``padding`` + horizontal flip in training mode.
        padding: crop padding (CIFAR standard: 4).
        seed: seed of this module's augmentation generator.
    """

    def __init__(self, mean: Sequence[float] = (0.0,), std: Sequence[float] = (1.0,), augment: bool = False,
                 padding: int = 4, seed: int = 0):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.augment, self.padding, self.seed = augment, padding, seed
        self._generator: torch.Generator | None = None
        self._generator_device: torch.device | None = None

    def _gen(self, device: torch.device) -> torch.Generator:
        # compared with the device it was made for (a CUDA generator may report "cuda" for "cuda:0"),
        # so the stream is created once per device and never silently reset to the seed
        if self._generator is None or self._generator_device != device:
            self._generator = torch.Generator(device=device).manual_seed(self.seed)
            self._generator_device = device
        return self._generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.augment:
            x = random_crop_flip(x, self.padding, self._gen(x.device))
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        out = (x - self.mean) / self.std
        # bf16-true / 16-true convert this module's buffers with the network: hand it its dtype
        return out.to(self.mean.dtype) if self.mean.dtype in (torch.bfloat16, torch.float16) else out

    def extra_repr(self) -> str:
        return f"augment={self.augment}, padding={self.padding}"


class WithInput(nn.Module):
    """``input`` module (e.g. :class:`ImageInput`) followed by the client network ``net``."""

    def __init__(self, input: nn.Module, net: nn.Module):
        super().__init__()
        self.input = input
        self.net = net

    def forward(self, x):
        return self.net(self.input(x))
