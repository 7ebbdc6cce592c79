"""Small networks for the embedded digits default (8x8 grey images, 10 classes).

Every fdlit model takes ``input_shape`` and ``num_classes``; the loop fills them from the data, so a
config only sets the architecture's own knobs.
"""

from __future__ import annotations

import math

from torch import nn

from fdlit.errors import ConfigError, check_at_least
from fdlit.models.base import ClientNetwork


def check_dropout(dropout: float) -> float:
    if not 0 <= dropout < 1:
        raise ConfigError("model.dropout", f"must be in [0, 1), got {dropout}")
    return dropout


class SmallCNN(ClientNetwork):
    """Two 3x3 conv layers, one 2x2 max-pool and a two-layer head (~30k parameters on digits).

    Args:
        input_shape: shape of one input (C, H, W), filled in from the data.
        num_classes: number of classes C, filled in from the data.
        channels: output channels of the first convolution (the second has twice as many).
        hidden: width of the head's hidden layer.
        dropout: dropout probability before the output layer, in [0, 1).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...] | None = None,
        num_classes: int | None = None,
        channels: int = 16,
        hidden: int = 64,
        dropout: float = 0.0,
    ):
        check_at_least("model.channels", channels, 1)
        check_at_least("model.hidden", hidden, 1)
        check_dropout(dropout)
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

    def embed(self, x):
        """The penultimate features (the input of the output layer): ``forward(x) == classify(embed(x))``."""
        return self.head[:-1](self.features(x))

    def classify(self, features):
        return self.head[-1](features)


class MLP(ClientNetwork):
    """Fully connected network on flattened inputs.

    Args:
        input_shape: shape of one input (C, H, W), filled in from the data.
        num_classes: number of classes C, filled in from the data.
        hidden: width of every hidden layer, in order (e.g. ``[128, 128]``); ReLU after each.
        dropout: dropout probability after every hidden layer, in [0, 1).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...] | None = None,
        num_classes: int | None = None,
        hidden: list[int] = [128, 128],
        dropout: float = 0.0,
    ):
        if any(not isinstance(h, int) or h < 1 for h in hidden):
            raise ConfigError("model.hidden", f"every layer width must be an integer >= 1, got {list(hidden)}")
        check_dropout(dropout)
        super().__init__()
        dims = [math.prod(input_shape or (1, 8, 8)), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(dims[:-1], dims[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU(), nn.Dropout(dropout)]
        layers.append(nn.Linear(dims[-1], num_classes or 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)

    def embed(self, x):
        """The penultimate features (the input of the output layer): ``forward(x) == classify(embed(x))``."""
        return self.net[:-1](x)

    def classify(self, features):
        return self.net[-1](features)
