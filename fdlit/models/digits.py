"""Small networks for the embedded digits default (8x8 grey images, 10 classes).

Every fdlit model takes ``input_shape`` and ``num_classes``; the loop fills them from the data, so a
config only sets the architecture's own knobs.
"""

from __future__ import annotations

import math
from typing import Optional

from torch import nn


class SmallCNN(nn.Module):
    """Two 3x3 conv layers, one 2x2 max-pool and a two-layer head (~30k parameters on digits)."""

    def __init__(
        self,
        input_shape: Optional[tuple[int, ...]] = None,
        num_classes: Optional[int] = None,
        channels: int = 16,
        hidden: int = 64,
        dropout: float = 0.0,
    ):
        super().__init__()
        c, h, w = input_shape or (1, 8, 8)
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * channels * (h // 2) * (w // 2), hidden), nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes or 10),
        )

    def forward(self, x):
        return self.head(self.features(x))


class MLP(nn.Module):
    """Fully connected network on flattened inputs."""

    def __init__(
        self,
        input_shape: Optional[tuple[int, ...]] = None,
        num_classes: Optional[int] = None,
        hidden: list[int] = [128, 128],
        dropout: float = 0.0,
    ):
        super().__init__()
        dims = [math.prod(input_shape or (1, 8, 8)), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(), nn.Dropout(dropout)]
        layers.append(nn.Linear(dims[-1], num_classes or 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)
