"""LeNet-5 (LeCun et al. 1998) for MNIST / Fashion-MNIST, as in the workshop paper
(Kovalchuk et al. 2025).

Classic layout: conv 5x5 (6) -> pool -> conv 5x5 (16) -> pool -> fc 120 -> fc 84 -> fc C. 28x28
inputs are zero-padded by 2 in the first convolution (the original took 32x32). **choice** (the workshop
paper only names "LeNet architectures"): ReLU and max-pooling, the common modern form, instead of the original
scaled tanh and subsampling.
"""

from __future__ import annotations

from torch import nn

from fdlit.errors import check_at_least
from fdlit.models.base import ClientNetwork


class LeNet5(ClientNetwork):
    """LeNet-5 as in the module docstring.

    Args:
        input_shape: shape of one input (C, H, W); 28x28 is padded to 32x32, filled in from the data.
        num_classes: number of classes C, filled in from the data.
        feature_dim: width of the penultimate layer (84 in LeNet-5), the features ``embed`` gives; another
            width lets LeNet-5 share a feature space with other networks (FedProto, FedTGP, FedGH, LG-FedAvg).
    """

    def __init__(self, input_shape: tuple[int, ...] | None = None, num_classes: int | None = None,
                 feature_dim: int = 84):
        check_at_least("model.feature_dim", feature_dim, 1)
        super().__init__()
        c, h, w = input_shape or (1, 28, 28)
        pad = 2 if h < 32 else 0
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, 5, padding=pad), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        fh, fw = ((h + 2 * pad - 4) // 2 - 4) // 2, ((w + 2 * pad - 4) // 2 - 4) // 2
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * fh * fw, 120), nn.ReLU(),
            nn.Linear(120, feature_dim), nn.ReLU(),
            nn.Linear(feature_dim, num_classes or 10),
        )

    def forward(self, x):
        return self.classifier(self.features(x))

    def embed(self, x):
        """The penultimate features (the input of the output layer): ``forward(x) == classify(embed(x))``."""
        return self.classifier[:-1](self.features(x))

    def classify(self, features):
        return self.classifier[-1](features)
