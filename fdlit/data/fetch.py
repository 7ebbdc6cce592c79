"""``python -m fdlit data fetch <dataset> --to DIR``: a paper dataset from the Hugging Face hub, written in
the on-disk format fdlit reads with ``--data.data_dir DIR`` (:mod:`fdlit.data.local_files`).

Run it on a machine with network, copy DIR to the machine without: MNIST and Fashion-MNIST become the
four gzipped IDX files (LeCun et al. 1998), CIFAR-10/100 the python batches (Krizhevsky 2009) in
``DIR/cifar-10-batches-py`` / ``DIR/cifar-100-python``, Yahoo Answers a ``save_to_disk`` folder.
``--from SRC`` converts a copy already on disk instead (any ``--data.data_dir`` form: a hub snapshot,
a save_to_disk folder, a Hugging Face cache folder).
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
from jsonargparse import ArgumentParser

from fdlit.data.hub import HUB_DATASETS, images_to_uint8, load_hub_splits
from fdlit.data.local_files import IDX_FILES, LOCAL_SOURCES
from fdlit.errors import ConfigError

CIFAR_TRAIN_BATCHES = 5  # cifar-10-batches-py: data_batch_1 .. data_batch_5


def fetch_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fdlit data fetch", allow_abbrev=False,
                            description="Save a paper dataset in the files fdlit reads with --data.data_dir DIR "
                                        "(IDX for MNIST / Fashion-MNIST, the python batches for CIFAR, a save_to_disk "
                                        "folder for Yahoo Answers), from the Hugging Face hub or a copy on disk.")
    parser.add_argument("dataset", type=str, help=f"One of: {', '.join(sorted(HUB_DATASETS))}.")
    parser.add_argument("--to", type=str, required=True, help="The folder to write (created; --data.data_dir DIR reads it).")
    parser.add_argument("--from", dest="source", type=str | None, default=None,
                        help="Read a copy on disk instead of the hub (a --data.data_dir form).")
    return parser


def write_idx(path: Path, array: np.ndarray) -> None:
    """A gzipped IDX file of uint8 values: 0, 0, type 0x08, ndim, big-endian dims, then the bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes(), mtime=0))


def _arrays(name: str, source: str | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    spec = HUB_DATASETS[name]
    splits = load_hub_splits(spec, source)
    return {split: (images_to_uint8(ds, spec.image).numpy(), np.asarray(ds[spec.label], dtype=np.int64))
            for split, ds in splits.items()}


def _write_cifar(folder: Path, fmt: str, arrays: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    label_key = b"labels" if fmt == "cifar10" else b"fine_labels"

    def batch(x: np.ndarray, y: np.ndarray) -> bytes:
        return pickle.dumps({b"data": x.reshape(len(x), -1), label_key: y.tolist()})

    x, y = arrays["train"]
    if fmt == "cifar10":
        for i, part in enumerate(np.array_split(np.arange(len(y)), CIFAR_TRAIN_BATCHES), start=1):
            (folder / f"data_batch_{i}").write_bytes(batch(x[part], y[part]))
        (folder / "test_batch").write_bytes(batch(*arrays["test"]))
    else:
        (folder / "train").write_bytes(batch(x, y))
        (folder / "test").write_bytes(batch(*arrays["test"]))


def fetch(name: str, to: str, source: str | None = None) -> Path:
    """Write ``name`` under ``to`` in the format ``--data.data_dir`` reads; returns the folder to pass."""
    if name not in HUB_DATASETS:
        raise ConfigError("dataset", f"allowed: {', '.join(sorted(HUB_DATASETS))}; got {name!r}")
    out = Path(to).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    spec, local = HUB_DATASETS[name], LOCAL_SOURCES.get(name)
    if spec.image is None:  # text: the rows as they are, for load_from_disk
        import datasets as hf

        hf.DatasetDict(load_hub_splits(spec, source)).save_to_disk(str(out))
        return out
    arrays = _arrays(name, source)
    if local.format == "idx":
        for split, (images, labels) in IDX_FILES.items():
            x, y = arrays[split]
            write_idx(out / f"{images}.gz", x[:, 0])
            write_idx(out / f"{labels}.gz", y)
    else:
        _write_cifar(out / local.subfolders[0], local.format, arrays)
    return out


def main(argv: list[str]) -> int:
    """``fdlit data fetch ...``; errors are ConfigErrors, reported by the caller."""
    if argv[:1] != ["fetch"]:
        raise ConfigError("data", f"allowed: fetch (`fdlit data fetch --help`); got {' '.join(argv[:1]) or 'nothing'}")
    parser = fetch_parser()
    parser.exit_on_error = False
    try:
        cfg = parser.parse_args(argv[1:])
    except argparse.ArgumentError as exc:
        raise ConfigError("data fetch", " ".join(str(exc).split()) + " (`fdlit data fetch --help`)") from None
    folder = fetch(cfg.dataset, cfg.to, cfg.source)
    print(f"fdlit data fetch: {cfg.dataset} written to {folder}; use it with --data.data_dir {folder}")
    return 0
