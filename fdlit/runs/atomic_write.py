"""The one way fdlit writes a file: a temporary file in the target's folder, fsync, rename.

A reader never sees half a file, and a failed write (disk full, Ctrl-C) leaves the old file as it
was and no ``.tmp`` behind. Before anything is written, :func:`check_target` refuses a target that
is not a plain file (a device such as ``/dev/full``, a folder, a link: renaming over it would
replace what it is, writing through it would change what it points to), and a target inside a run
directory unless the write is that run's own (``run_dir``): ``export --out RUN/checkpoint.pt`` is
refused, the checkpoint stays as it was. Disk full is one OSError naming the target (``No space
left on device: <path>``; a quota or the process's file size limit likewise), which the command
line prints as one line.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from fdlit.errors import ConfigError

# what marks a folder as a run directory (fdlit.runs.directory's file names), besides its config.yaml
RUN_MARKERS = ("metrics.jsonl", "checkpoint.pt", "run.lock", "summary.json", "communication.jsonl")

Content = bytes | str | Callable[[BinaryIO], None]


class UnsafeTarget(ConfigError):
    """A file fdlit was asked to write is not one it may replace."""


def is_run_directory(folder: Path) -> bool:
    """Whether ``folder`` holds a run (its config.yaml and one of the files a run writes)."""
    folder = Path(folder)
    return (folder / "config.yaml").exists() and any((folder / name).exists() for name in RUN_MARKERS)


def enclosing_run_directory(path: str | Path) -> Path | None:
    """The run directory that ``path`` is in or is, at any depth (``RUN/sub/m.pt`` is in ``RUN``);
    None when there is none. Links are followed, so a link into a run folder is inside it."""
    folder = Path(os.path.abspath(path))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    folder = folder.resolve()
    for candidate in (folder, *folder.parents):
        if is_run_directory(candidate):
            return candidate
    return None


def check_target(path: str | Path, field: str = "out", run_dir: str | Path | None = None) -> Path:
    """Refuse (:class:`UnsafeTarget`, one line naming ``path``) a target that is not a regular file
    or nothing yet, one whose folder does not exist, and one inside a run directory other than
    ``run_dir`` (the run whose own file this is)."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UnsafeTarget(field, f"cannot check {str(path)!r}: {exc.strerror}") from None
    if mode is not None and stat.S_ISLNK(mode):
        raise UnsafeTarget(field, f"{str(path)!r} is a link; fdlit writes only plain files: name the file itself")
    if mode is not None and stat.S_ISDIR(mode):
        raise UnsafeTarget(field, f"{str(path)!r} is a folder; name a file in it")
    if mode is not None and not stat.S_ISREG(mode):
        raise UnsafeTarget(field, f"{str(path)!r} is not a regular file (a device, pipe or socket); "
                           "fdlit replaces only plain files: name a file")
    if not path.parent.is_dir():
        raise UnsafeTarget(field, f"{str(path)!r}: its folder does not exist")
    own = run_dir is not None and _same(path.parent, Path(run_dir))
    enclosing = None if own else enclosing_run_directory(path.parent)
    if enclosing is not None:
        raise UnsafeTarget(field, f"{str(path)!r} is inside the run directory {str(enclosing)!r}, whose files "
                           "only its run writes; write it somewhere else")
    return path


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def write_file(path: str | Path, content: Content, field: str = "out", run_dir: str | Path | None = None,
               sync_folder: bool = False) -> Path:
    """Write ``content`` (bytes, text as UTF-8, or a function that writes into the open binary
    file) to ``path`` atomically, after :func:`check_target`; ``path`` back. ``sync_folder``: also
    make the rename durable against power loss (an fsync of the folder)."""
    path = check_target(path, field, run_dir)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)  # left by a killed writer
        with open(tmp, "xb") as f:  # "x": never through a link someone put in its place
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # disk full, Ctrl-C: the old file stays, and no half-written .tmp
        _remove(tmp)
        if isinstance(exc, OSError) and exc.errno in STORAGE_LIMITS:
            raise storage_error(exc.errno, path) from None
        if isinstance(exc, OSError) and exc.filename in (str(tmp), tmp):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise
    if sync_folder:
        _sync_folder(path.parent)
    return path


# a write that ran out of room: the disk, the user's quota, or the process's file size limit
STORAGE_LIMITS = {errno.ENOSPC: "", errno.EDQUOT: "",
                  errno.EFBIG: " (the process's file size limit, `ulimit -f`, was reached)"}


def storage_error(code: int, path: str | Path) -> OSError:
    """The OSError a failed write ends with: the system's words for ``code`` (``No space left on
    device``; ``File too large`` with what limit that is) and the file it was writing."""
    return OSError(code, os.strerror(code) + STORAGE_LIMITS.get(code, ""), str(path))


def _remove(tmp: Path) -> None:
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (power loss); not possible on every filesystem."""
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
