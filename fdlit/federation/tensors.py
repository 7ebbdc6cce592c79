"""The federation's data on the run's device: held-out, public and private tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fdlit.data.federated import ClientData, FederatedData


@dataclass(frozen=True)
class FederationTensors:
    """Test, public, private and validation tensors on the run's device, and the M x T mask of the
    test samples of each client's own classes (local accuracy)."""

    test_x: torch.Tensor
    test_y: torch.Tensor
    public_x: torch.Tensor
    public_y: torch.Tensor
    private: list[tuple[torch.Tensor, torch.Tensor]]
    val_x: torch.Tensor | None
    val_y: torch.Tensor | None
    local_masks: torch.Tensor

    @classmethod
    def on_device(cls, data: FederatedData, client_data: list[ClientData], device: torch.device) -> FederationTensors:
        validation = getattr(data, "validation", None)  # data.validation_size > 0 only
        return cls(
            test_x=data.test.x.to(device), test_y=data.test.y.to(device),
            public_x=data.public.x.to(device), public_y=data.public.y.to(device),
            private=[(cd.train.x.to(device), cd.train.y.to(device)) for cd in client_data],
            val_x=validation.x.to(device) if validation is not None else None,
            val_y=validation.y.to(device) if validation is not None else None,
            local_masks=torch.stack([data.local_test_mask(cd.classes) for cd in client_data]).float().to(device),
        )
