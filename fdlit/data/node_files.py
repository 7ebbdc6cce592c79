"""A deployed node's own images and labels, read from its folder or its operator's loader within the
IDX reader's bounds (fdlit.data.idx), with numpy only: the SuperNode checks them at its start, before it
imports torch or Flower, so a hostile or broken folder is refused in one line at the cost of a bare
Python. fdlit.data.node_local turns them into the node's clients.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fdlit.data.local_files import IDX_FILES, _idx_file, read_idx
from fdlit.errors import ConfigError

FIELD = "node-config local-data"


def read_node_data(source: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The node's (images N x H x W uint8, labels N int64) from its folder or its loader (a dotted path);
    one-line ConfigError when they are not that."""
    path = Path(source)
    if not path.is_dir() and "/" not in str(source) and "." in str(source):  # the operator's own loader
        x, y = _from_loader(str(source))
        where = str(source)
    else:
        if not path.is_dir():
            raise ConfigError(FIELD, f"{path} is not a folder (nor a dotted path of a loader)")
        images, labels = (_idx_file(path, stem) for stem in IDX_FILES["train"])
        if images is None or labels is None:
            raise ConfigError(FIELD, f"{path} must hold {' and '.join(IDX_FILES['train'])} (IDX, gzipped or not)")
        try:
            x, y = read_idx(images), read_idx(labels)
        except ConfigError as exc:
            raise ConfigError(FIELD, str(exc).split(": ", 1)[-1]) from None
        where = f"{path}: {images.name} and {labels.name}"
    if x.ndim == 4 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y) or x.dtype != np.uint8 or len(y) == 0:
        raise ConfigError(FIELD, f"{where} give images {x.shape} {x.dtype} and labels {y.shape}: not N x H x W "
                          "uint8 images with N labels")
    return x, y.astype(np.int64)


def _from_loader(dotted: str) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) from the operator's loader ``module.name``, as numpy arrays."""
    import importlib

    module, _, name = dotted.rpartition(".")
    try:
        loader = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(FIELD, f"cannot import {dotted!r} ({type(exc).__name__}: {exc})") from None
    try:
        out = loader()
        x, y = (v.numpy() if hasattr(v, "numpy") else np.asarray(v) for v in out)  # a tensor or an array
    except Exception as exc:  # the operator's code: whatever it raises is one line here
        raise ConfigError(FIELD, f"{dotted}() did not give (images, labels): {type(exc).__name__}: {exc}") from None
    return x, y
