"""Reading a run folder's files within bounds: only regular files of the folder (a link out of it, a
device or a pipe is refused unread), each up to its cap (logs are then read a line at a time).
Readers of run folders someone else made (report, sweep, export, resume) go through here; the caps
are far above what any run writes (docs/reliability.md lists them).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

from fdlit.errors import ConfigError

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
COMMUNICATION = "communication.jsonl"
SUMMARY = "summary.json"
SWEEP_BOOKKEEPING = ".sweep"  # a sweep folder's own files (results, lock), beside and never among its runs

# Caps far above what any run writes (a 1000-client run's metrics row is ~100 KiB), far below what
# hangs or exhausts a reader; docs/reliability.md lists them.
MiB = 2**20
SIZE_LIMITS = {CONFIG: 16 * MiB, SUMMARY: 64 * MiB, METRICS: 1024 * MiB, COMMUNICATION: 2048 * MiB}
DEFAULT_SIZE_LIMIT = 64 * MiB
MAX_LINE = 16 * MiB
MAX_CONFIG_VALUES = 1_000_000
MAX_JSON_DEPTH = 64  # nesting of a JSON value; fdlit writes at most a few levels (a matrix in a row)


class RunFileError(ConfigError):
    """A file of a run folder that fdlit refuses to read (one line naming it)."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = Path(path), f"{Path(path).name} {reason}"
        super().__init__("run_dir", f"{path} {reason}")


def check_run_file(path: Path) -> Path:
    """Refuse a run folder's file that is not a regular file, or a link out of its folder (a missing
    file is the OSError it always was)."""
    path = Path(path)
    if path.is_symlink():
        try:
            inside = path.resolve(strict=True).is_relative_to(path.parent.resolve())
        except (OSError, RuntimeError):  # a dangling link, a loop of links
            raise RunFileError(path, "is a link that leads nowhere") from None
        if not inside:
            raise RunFileError(path, "is a link to a file outside its run folder; fdlit reads only the run's own files")
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise RunFileError(path, "is not a regular file (a device, pipe, socket or folder)")
    return path


@contextlib.contextmanager
def open_run_file(path: Path, limit: int | None = None):
    """A run folder's file open for reading (binary) and its size cap (``SIZE_LIMITS``), refused when it
    is no regular file inside the folder: a link to /dev/zero is refused at once, not read forever."""
    path = check_run_file(Path(path))
    limit = limit or SIZE_LIMITS.get(path.name, DEFAULT_SIZE_LIMIT)
    # O_NONBLOCK: a pipe swapped in after the check cannot block the open
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RunFileError(path, "is not a regular file (a device, pipe, socket or folder)")
        yield f, limit


def read_run_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a run folder's file, within its cap (:func:`open_run_file`)."""
    with open_run_file(path, limit) as (f, limit):
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RunFileError(path, f"is larger than {limit // MiB} MiB, the most fdlit reads of it")
    return data


class TooDeep(ValueError):
    """A JSON value nested deeper than ``MAX_JSON_DEPTH``: not something fdlit wrote."""


def load_json(text: str | bytes):
    """``json.loads`` within ``MAX_JSON_DEPTH`` levels: a value nested deeper (which would exhaust the
    parser's recursion, or every reader after it) is a ``ValueError`` like any text that is not JSON."""
    try:
        value = json.loads(text)
    except RecursionError:  # the C parser stops itself at the interpreter's recursion limit
        raise TooDeep(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    if _depth_over(value, MAX_JSON_DEPTH):
        raise TooDeep(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _depth_over(value, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts deeper than ``limit`` (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def check_lines(path: Path, lines: list[str]) -> None:
    longest = max((len(line) for line in lines), default=0)
    if longest > MAX_LINE:
        raise RunFileError(path, f"has a line longer than {MAX_LINE // MiB} MiB, the most fdlit reads of one line")


def _expanded_size(node, budget: int) -> int:
    """How many values ``node`` holds with every shared (aliased) part counted each time it occurs;
    stops counting past ``budget``."""
    count, stack = 0, [node]
    while stack and count <= budget:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count
