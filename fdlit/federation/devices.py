"""Which device a run trains on (``federation.devices``), checked against this machine before any work.

A run trains every client in one process on one device. ``auto`` takes the accelerator's first device
(Lightning's ``devices=1``); an index (``1`` or ``[1]``) takes that GPU (Lightning's ``devices=[1]``).
On a CPU, or with an accelerator that has one device (MPS), only ``auto`` or index 0 can be meant.
"""

from __future__ import annotations

from typing import Literal

import torch

from fdlit.errors import ConfigError

Devices = int | list[int] | Literal["auto"]


def gpu_count(accelerator: str) -> int:
    """How many devices of the kind ``accelerator`` resolves to this machine has (0: the CPU)."""
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = 1 if torch.backends.mps.is_available() else 0
    if accelerator in ("cuda", "gpu", "auto") and cuda:
        return cuda
    if accelerator in ("mps", "gpu", "auto") and mps:
        return mps
    return 0


def check_devices(accelerator: str, devices: Devices) -> int | list[int]:
    """``federation.devices`` as Fabric's ``devices`` argument; a ConfigError naming what this machine
    has when it cannot be honoured."""
    if devices == "auto":
        return 1
    index = devices[0] if isinstance(devices, list) and len(devices) == 1 else devices
    index = int(index) if isinstance(index, str) and index.isdigit() else index
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError("federation.devices", "one device: auto, or a GPU's index such as 1 or [1] (a run trains "
                          "all its clients on one device; for several GPUs use the Ray executor: --federation.executor "
                          "fdlit.execution.RayExecutor with num_gpus_per_client, docs/ray.md); "
                          f"got {devices!r}")
    count = gpu_count(accelerator)
    if count == 0:
        raise ConfigError("federation.devices", f"this machine runs accelerator {accelerator!r} on the CPU: no GPU "
                          f"to choose; only auto is allowed, got {devices!r}")
    if index >= count:
        raise ConfigError("federation.devices", f"this machine has {count} GPU(s) (indices 0 to {count - 1}); "
                          f"got {devices!r}")
    return [index]
