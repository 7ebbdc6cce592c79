"""Datasets as in-memory tensors.

Every dataset fdlit trains on is small enough to live as one tensor on the training device
(digits, CIFAR, MNIST), so there are no DataLoader workers: batches are index slices.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import inspect
from pathlib import Path

import numpy as np
import torch

from fdlit.data import hub as _hub
from fdlit.data.tensor_dataset import TensorDataset
from fdlit.errors import ConfigError


def load_digits() -> TensorDataset:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), shipped offline.

    Pixels are 0..16 in the source; scaled to [0, 1] and shaped (N, 1, 8, 8) like an image set.
    The file is read as ``sklearn.datasets.load_digits`` reads it, without importing scikit-learn
    (which imports SciPy and pandas: over a CPU second of a run's start-up).
    """
    images, target = _digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0  # fresh tensors: nothing shared between runs
    y = torch.tensor(target, dtype=torch.long)
    return TensorDataset(x, y, num_classes=10, name="digits")


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits file's images and labels, parsed once per process (a sweep's runs, one after
    another or stacked, each load the set: parsing the text file was ~50 ms of every run's set-up)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package folder; runs none of it
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is not None and path.is_file():
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",")
        images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    else:  # another layout of scikit-learn: its own loader
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        images, target = bunch.images, bunch.target
    images.flags.writeable = target.flags.writeable = False
    return images, target


# name -> loader returning the full labelled pool; paper datasets register here as they are added.
DATASETS = {"digits": load_digits}
# name -> number of classes, known without loading (checks of a config before any work)
NUM_CLASSES = {"digits": 10}


def input_scalings(name: str) -> tuple[str, ...]:
    """The ``data.input_scaling`` values ``name`` supports: the 8-bit image sets ``standardize`` (their channel
    mean/std) and ``unit`` (x/255); digits only ``unit`` (its 0..16 pixels divided by 16, no published
    statistics); text none. The first is the dataset's default."""
    if name == "digits":
        return ("unit",)
    spec = _hub.HUB_DATASETS.get(name)
    if spec is None or spec.image is None:
        return ()
    return ("standardize", "unit")


def load_dataset(name: str, **options):
    """Load a registered dataset; ``options`` (data_dir, augment, ...) reach loaders that accept them."""
    if name not in DATASETS:
        raise ConfigError("data.dataset", f"unknown dataset {name!r}; allowed: {sorted(DATASETS)}")
    loader = DATASETS[name]
    accepted = inspect.signature(loader).parameters
    return loader(**{k: v for k, v in options.items() if k in accepted})


def augment_images(x: torch.Tensor, generator: torch.Generator, max_shift: int = 1) -> torch.Tensor:
    """Batched random translation by up to ``max_shift`` pixels (zero padding), on x's device.

    Used for the "augmented" calibration set of Kovalchuk et al. 2026, Table 2 (GMMs fitted on augmented private data).
    """
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (max_shift,) * 4)
    dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator).to(x.device)
    dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device)[None, :])  # n x h
    cols = (dx[:, None] + torch.arange(w, device=x.device)[None, :])  # n x w
    idx_n = torch.arange(n, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx_n, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


# paper datasets (CIFAR-10/100, MNIST, Fashion-MNIST, Yahoo Answers) via Hugging Face datasets
_hub.register(DATASETS)
NUM_CLASSES.update({name: spec.num_classes for name, spec in _hub.HUB_DATASETS.items()})
