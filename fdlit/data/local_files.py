"""Image datasets from their original on-disk formats, without torchvision.

* IDX (LeCun et al. 1998): MNIST and Fashion-MNIST ship as ``train-images-idx3-ubyte``,
  ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each
  optionally gzipped (``.gz``). The folder may hold them directly, or in torchvision's layout
  (``MNIST/raw/``, ``FashionMNIST/raw/``).
* CIFAR python batches (Krizhevsky 2009): ``cifar-10-batches-py`` (``data_batch_1..5``, ``test_batch``)
  and ``cifar-100-python`` (``train``, ``test``; fine labels), pickled dicts of N x 3072 uint8 rows.
  The folder may be the batches folder itself or its parent (where the tarball was unpacked).

``find_local_arrays(name, folder)`` returns ``{"train": (x, y), "test": (x, y)}`` (x: N x C x H x W
uint8, y: int64) when the folder holds the dataset in one of these formats, else None. Fashion-MNIST
and MNIST are also looked for in Debian's location (``apt-get install dataset-fashion-mnist`` installs
``/usr/share/datasets/fashion-mnist/``) when no folder is given.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fdlit.data.idx import read_idx  # noqa: F401 (re-exported: a node operator's loader may use it)
from fdlit.errors import ConfigError

IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


@dataclass(frozen=True)
class LocalSource:
    """How a dataset is found on disk and where its original files come from."""

    format: str  # "idx", "cifar10" or "cifar100"
    url: str  # the original files (the URLs torchvision downloads from)
    subfolders: tuple[str, ...]  # where the files sit below a given folder (torchvision / tarball layouts)
    default_dir: str | None = None  # looked in when no data_dir is given
    apt_package: str | None = None


LOCAL_SOURCES: dict[str, LocalSource] = {
    "fashion_mnist": LocalSource("idx", "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                                 ("FashionMNIST/raw", "fashion-mnist"), "/usr/share/datasets/fashion-mnist",
                                 "dataset-fashion-mnist"),
    # Debian has no MNIST package; the same Debian-style location is looked in for a copy put there
    "mnist": LocalSource("idx", "https://ossci-datasets.s3.amazonaws.com/mnist/",
                         ("MNIST/raw", "mnist"), "/usr/share/datasets/mnist"),
    "cifar10": LocalSource("cifar10", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                           ("cifar-10-batches-py",)),
    "cifar100": LocalSource("cifar100", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                            ("cifar-100-python",)),
}


def local_fetch_hint(name: str) -> str:
    """The ways to get ``name``'s original files (apt package, download URL), or "" when it has none."""
    src = LOCAL_SOURCES.get(name)
    if src is None:
        return ""
    lines = []
    if src.apt_package:
        lines.append(f"    sudo apt-get install {src.apt_package}   # installs {src.default_dir}, found without flags")
    if src.format == "idx":
        lines.append(f"    download the four IDX files (.gz is fine) from {src.url} into DIR   # then --data.data_dir DIR")
    else:
        lines.append(f"    curl -L {src.url} | tar xz -C DIR   # then --data.data_dir DIR")
    return "or use the original files:\n" + "\n".join(lines)


def _idx_file(folder: Path, stem: str) -> Path | None:
    """The file ``stem`` (or ``stem.gz``) in ``folder``: anything there but a folder, so that a pipe, a
    device or a link to one is named by the reader's refusal rather than taken for a missing file."""
    for name in (stem, stem + ".gz"):
        if os.path.lexists(folder / name) and not (folder / name).is_dir():
            return folder / name
    return None


def _read_idx_folder(folder: Path) -> dict | None:
    paths = {split: [_idx_file(folder, stem) for stem in stems] for split, stems in IDX_FILES.items()}
    found = [p for pair in paths.values() for p in pair if p is not None]
    if not found:
        return None
    if len(found) < 4:
        missing = [stem for split, stems in IDX_FILES.items() for stem, p in zip(stems, paths[split], strict=True) if p is None]
        raise ConfigError("data.data_dir", f"{folder} holds some IDX files but not {missing} (with or without .gz)")
    out = {}
    for split, (images, labels) in paths.items():
        x, y = read_idx(images), read_idx(labels)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y) or x.dtype != np.uint8:
            raise ConfigError("data.data_dir", f"{images.name} ({x.shape}, {x.dtype}) and {labels.name} ({y.shape}) "
                              "are not N x H x W uint8 images with N labels")
        out[split] = (x[:, None], y.astype(np.int64))
    return out


class _ArraysOnly(pickle.Unpickler):
    """CIFAR's python batches are pickles: unpickle dicts, lists, bytes and NumPy arrays, never any
    other class, so a crafted file in a data folder cannot run code."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch file")
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict:
    with open(path, "rb") as f:
        try:
            return _ArraysOnly(f, encoding="bytes").load()
        except pickle.UnpicklingError as exc:
            raise ConfigError("data.data_dir", f"{path} is not a CIFAR python batch ({exc})") from None


def _cifar_rows(batches: list[dict], label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    x = np.concatenate([np.asarray(b[b"data"], dtype=np.uint8) for b in batches])
    y = np.concatenate([np.asarray(b[label_key], dtype=np.int64) for b in batches])
    return x.reshape(-1, 3, 32, 32), y


def _read_cifar_folder(folder: Path, fmt: str) -> dict | None:
    if fmt == "cifar10":
        train_files = [folder / f"data_batch_{i}" for i in range(1, 6)]
        test_file, label_key = folder / "test_batch", b"labels"
    else:
        train_files, test_file, label_key = [folder / "train"], folder / "test", b"fine_labels"
    files = [*train_files, test_file]
    if not any(p.is_file() for p in files):
        return None
    missing = [p.name for p in files if not p.is_file()]
    if missing:
        raise ConfigError("data.data_dir", f"{folder} holds some CIFAR python batches but not {missing}")
    return {"train": _cifar_rows([_unpickle(p) for p in train_files], label_key),
            "test": _cifar_rows([_unpickle(test_file)], label_key)}


def find_local_folder(name: str) -> Path | None:
    """The dataset's default location (e.g. Debian's) when it holds a folder to read; None otherwise."""
    src = LOCAL_SOURCES.get(name)
    if src is None or not src.default_dir or not Path(src.default_dir).is_dir():
        return None
    return Path(src.default_dir)


def find_local_arrays(name: str, folder: str | None) -> dict | None:
    """``name``'s splits from ``folder`` (or, when None, the dataset's default location) in an original
    on-disk format; None when no such files are there (the caller then tries the hub)."""
    src = LOCAL_SOURCES.get(name)
    if src is None:
        return None
    base = Path(folder).expanduser() if folder is not None else (Path(src.default_dir) if src.default_dir else None)
    if base is None or not base.is_dir():
        return None
    for candidate in (base, *(base / sub for sub in src.subfolders)):
        if not candidate.is_dir():
            continue
        arrays = _read_idx_folder(candidate) if src.format == "idx" else _read_cifar_folder(candidate, src.format)
        if arrays is not None:
            return arrays
    return None
