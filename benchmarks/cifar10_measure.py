"""What benchmarks/cifar10_gpu.py measures with: synthetic CIFAR-10-shaped data, GPU utilisation
sampling and the model FLOPs of a round."""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import threading
import time

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def synthetic_cifar10(train: int, test: int, size: int = 32):
    """Random uint8 images with CIFAR-10's shape (``size`` x ``size``: 32; smaller for a functional
    run on a CPU), labels and input module (for timing only)."""
    from functools import partial

    import torch

    from fdlit.data.augment import ImageInput
    from fdlit.data.datasets import TensorDataset

    g = torch.Generator().manual_seed(0)
    transform = partial(ImageInput, mean=CIFAR10_MEAN, std=CIFAR10_STD, augment=True)
    out = []
    for n, name in ((train, "train"), (test, "test")):
        x = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
        y = torch.arange(n) % 10
        out.append(TensorDataset(x, y, 10, f"cifar10-synthetic/{name}", input_transform=transform))
    return out[0], out[1]


class UtilisationSampler:
    """Samples GPU utilisation (%) in a thread while ``active`` is set."""

    def __init__(self, device_index: int = 0, every: float = 0.2):
        self.samples: list[float] = []
        self.active = threading.Event()
        self._stop = threading.Event()
        self._read = self._reader(device_index)
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        if self._read is not None:
            self._thread.start()

    @staticmethod
    def _reader(index: int):
        import torch

        try:
            torch.cuda.utilization(index)
            return lambda: float(torch.cuda.utilization(index))
        except Exception:  # no pynvml
            pass
        if shutil.which("nvidia-smi"):
            cmd = ["nvidia-smi", "-i", str(index), "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
            return lambda: float(subprocess.run(cmd, capture_output=True, text=True).stdout.strip())
        return None

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            if self.active.is_set():
                with contextlib.suppress(Exception):  # a sample the tool could not give is skipped
                    self.samples.append(self._read())
            time.sleep(every)

    def mean(self) -> float:
        return statistics.mean(self.samples) if self.samples else float("nan")


def step_flop(model_name: str, batch: int, train: bool, size: int = 32) -> float:
    """Model FLOPs of one batch (forward, or forward + backward), counted on the meta device."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fdlit.models import ResNet18, SmallCNN

    with torch.device("meta"):
        shape = dict(input_shape=(3, size, size), num_classes=10)
        net = ResNet18(**shape, stem="cifar") if model_name == "ResNet18" else SmallCNN(**shape)
        x = torch.empty(batch, 3, size, size)
    with FlopCounterMode(display=False) as counter:
        out = net(x)
        if train:
            out.sum().backward()
    return float(counter.get_total_flops())


def round_flop(data, args, first: bool = False) -> float:
    """Model FLOPs of one round on the set-up federated ``data``: private and public training epochs, the
    public and calibration predictions, and the two evaluations on the test set (after each phase), for
    every client."""
    size = getattr(args, "size", 32)
    train, forward = step_flop(args.model, 1, True, size), step_flop(args.model, 1, False, size)
    private = sum(len(s.train) for s in data.clients)
    calibration = sum(len(s.calibration) for s in data.clients if s.calibration is not None)
    clients, public, test = len(data.clients), len(data.public), len(data.test)
    epochs = (args.first_epochs or args.epochs) if first else args.epochs
    return (epochs * (private + clients * public) * train
            + (clients * public + calibration + 2 * clients * test) * forward)
