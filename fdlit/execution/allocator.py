"""glibc's allocator told to keep large freed blocks for reuse instead of returning them to the kernel.

PyTorch's CPU tensors come from ``malloc``. glibc maps each block above its mmap threshold (128 KiB,
raised on the fly up to 32 MiB) with a fresh ``mmap`` and unmaps it on free, and trims the heap's
free top above 128 KiB, so a round that builds and drops the same large tensors every step (public-set
logits, kernel matrices, activations of a batch) page-faults all their memory in again, zero-filled
by the kernel, every time. With a fixed 32 MiB threshold (mallopt(3)'s documented maximum on 64-bit) and a 128 MiB
trim threshold, those blocks are served from the heap's free lists: on digits, Selective-FD (features)
costs 0.74x of its CPU per round with glibc's defaults, three quarters of its system time gone; blocks
above 32 MiB are still mapped (docs/speed-and-scale.md, Memory allocation).

The cost is memory held, not returned: at most the trim threshold of free heap above what the run
uses. A user who sets ``MALLOC_*`` variables, preloads another allocator (``LD_PRELOAD``: jemalloc,
tcmalloc) or runs on a C library without ``mallopt`` keeps what they have.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX",
                 "GLIBC_TUNABLES", "LD_PRELOAD")


def keep_large_blocks() -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module); True when set, False
    where it does not apply (not Linux glibc, or the user's own allocator settings)."""
    if not sys.platform.startswith("linux") or any(os.environ.get(name) for name in USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)  # this process's own symbols: its C library's
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: other C libraries' mallopt differs or does nothing
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
