"""Reading an IDX file (LeCun et al. 1998; gzipped when its name ends in ``.gz``) within bounds, so that
no file in a data folder can hang or exhaust the process that reads it.

- only a regular file outside /proc and /sys is opened, without blocking (a FIFO, a device, a link to
  ``/proc/self/mem`` are refused unread);
- the header is read first: the array it declares must fit :data:`MAX_BYTES`, and a gzipped file
  declaring more than :data:`RATIO_FROM` bytes at most :data:`MAX_RATIO` times its own size (a 3 MB
  gzip bomb declaring 3 GB is refused before anything is unpacked);
- the body is read up to the declared size plus one byte, so a sparse or padded file, or a gzip
  stream that unpacks to more than it declares, is refused without being read to its end;
- a corrupt gzip stream is a refusal, not a ``zlib.error``.

Each refusal is a one-line :class:`~fdlit.errors.ConfigError` for the field the caller names.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path

import numpy as np

from fdlit.configuration.bounded_yaml import open_regular
from fdlit.errors import ConfigError

MAX_BYTES = 2**31  # the largest IDX set fdlit knows (EMNIST by class, 547 MB) with room to spare
MAX_RATIO = 100  # IDX images gzip ~5:1 (MNIST 9.9 MB -> 47 MB); zeros 1000:1
RATIO_FROM = 2**26  # smaller files may pack tighter (a few blank images): they cannot exhaust memory
# IDX type byte -> numpy dtype (big-endian where it matters)
IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path, field: str = "data.data_dir") -> np.ndarray:
    """The array of the IDX file ``path`` in its declared shape, read within the bounds above."""
    path = Path(path)
    with open_regular(path, field, "an IDX data file") as raw:
        info = os.fstat(raw.fileno())
        zipped = path.suffix == ".gz"
        f = gzip.GzipFile(fileobj=raw, mode="rb") if zipped else raw
        try:
            return _read(f, path, field, info.st_size, zipped)
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            what = "not a gzip file or a damaged one" if zipped else (getattr(exc, "strerror", None) or exc)
            raise ConfigError(field, f"{path}: cannot read it ({what})") from None


def _read(f: io.BufferedIOBase, path: Path, field: str, size: int, zipped: bool) -> np.ndarray:
    head = f.read(4)
    if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in IDX_DTYPES:
        raise ConfigError(field, f"{path} is not an IDX file (bad magic number {head.hex()})")
    ndim = head[3]
    shape = f.read(4 * ndim)
    if len(shape) < 4 * ndim:
        raise ConfigError(field, f"{path}: {4 + len(shape)} bytes, shorter than its {ndim}-dimension header")
    dims = tuple(int(d) for d in np.frombuffer(shape, ">u4", count=ndim))
    dtype = np.dtype(IDX_DTYPES[head[2]])
    declared = int(np.prod(dims, dtype=object)) * dtype.itemsize if dims else dtype.itemsize
    if declared > MAX_BYTES:
        raise ConfigError(field, f"{path}: header says shape {dims} ({declared:,} bytes), more than the "
                          f"{MAX_BYTES:,} bytes fdlit reads of one file")
    if zipped and declared > RATIO_FROM and declared > MAX_RATIO * max(size, 1):
        raise ConfigError(field, f"{path}: header says shape {dims} ({declared:,} bytes), over {MAX_RATIO} times "
                          f"the {size:,} bytes of the gzip file; image data never packs that tightly")
    if not zipped and size != 4 + 4 * ndim + declared:
        raise ConfigError(field, f"{path}: header says shape {dims} ({declared:,} bytes), the file holds "
                          f"{size - 4 - 4 * ndim:,} bytes (truncated download?)")
    body = f.read(declared + 1)
    if len(body) != declared:
        held = f"{len(body):,}" if len(body) <= declared else "more than that"
        raise ConfigError(field, f"{path}: header says shape {dims} ({declared:,} bytes), the file holds {held} "
                          "bytes (truncated download?)")
    return np.frombuffer(body, dtype).reshape(dims).astype(dtype.newbyteorder("="))
