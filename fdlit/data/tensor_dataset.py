"""One dataset split as in-memory tensors: every dataset fdlit trains on is small enough to live as one
tensor on the training device, so batches are index slices and there are no DataLoader workers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class TensorDataset:
    """Inputs ``x`` (first dim = samples) and integer labels ``y`` of one dataset split."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    name: str = ""
    # factory of the module that turns stored inputs into network inputs (e.g. uint8 -> normalised
    # float + augmentation, fdlit.data.augment.ImageInput); the loop puts it in front of each model
    input_transform: Callable[..., torch.nn.Module] | None = None

    def __post_init__(self):
        if len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: {len(self.x)} inputs but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def subset(self, index: torch.Tensor, name: str | None = None) -> TensorDataset:
        return TensorDataset(self.x[index], self.y[index], self.num_classes, name or self.name, self.input_transform)
