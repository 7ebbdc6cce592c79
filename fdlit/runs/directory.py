"""The local run directory every run writes, W&B or not; resume, sweep and report read it (within bounds:
:mod:`fdlit.runs.run_files`). These two modules are the only code that knows its file names.

    <run_dir>/config.yaml         resolved config, written before training starts
    <run_dir>/metrics.jsonl       one JSON object per round, appended and fsynced as each round ends
    <run_dir>/communication.jsonl one JSON object per message (round, client, direction, kind, bytes)
    <run_dir>/summary.json        best/final numbers so far, replaced atomically every round
    <run_dir>/checkpoint.pt       the state after the last complete round (fdlit.runs.checkpoint)
    <run_dir>/run.lock            who holds the directory (pid, host); locked while a process writes it
    <run_dir>/<log>.damaged-<time> a damaged metrics/communication file, kept when resume rebuilt it
    <run_dir>/checkpoint.pt       the state after the last checkpointed round (fdlit.runs.checkpoint)
    <run_dir>/checkpoint-r<N>.pt  earlier checkpoints kept (``checkpoint.keep``)
    <run_dir>/wandb/              W&B's own files (offline runs)

A crash or kill leaves every completed round readable. A run directory is created once, for one
run; only a resume of that run writes into it again, and one process at a time (``RunLock``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import yaml

from fdlit.callbacks import FederationCallback, RoundView
from fdlit.configuration.run_settings import MAX_NAME, NAME_PATTERN, NAME_RULE, check_run_name  # noqa: F401
from fdlit.errors import ConfigError
from fdlit.runs import strict_json
from fdlit.runs.atomic_write import write_file

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking
    fcntl = None

from fdlit.runs.run_files import (  # noqa: F401 (the bounded reading of a run's files, re-exported)
    COMMUNICATION, CONFIG, DEFAULT_SIZE_LIMIT, MAX_CONFIG_VALUES, MAX_LINE, METRICS, SIZE_LIMITS, SUMMARY, MiB,
    RunFileError, TooDeep, _expanded_size, check_lines, check_run_file, load_json, open_run_file, read_run_file,
)
CHECKPOINT = "checkpoint.pt"
LOCK = "run.lock"

def safe_name(text: str) -> str:
    """``text`` made into an allowed run name: other characters (``/`` of hub ids, brackets of
    lists) become ``_``; a long name keeps its start and a hash of the whole."""
    name = re.sub(r"[^A-Za-z0-9._+=,-]+", "_", str(text)).lstrip("._+=,-") or "run"
    if len(name) > MAX_NAME:
        name = name[: MAX_NAME - 9] + "-" + hashlib.sha256(str(text).encode()).hexdigest()[:8]
    return name


def check_run_parent(field: str, value: str) -> Path:
    """The parent of new run directories must be (or be creatable as) a writable folder."""
    path = Path(value)
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(field, f"must be a folder (or not exist yet), but {str(probe)!r} is a file; got {value!r}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(field, f"{str(probe)!r} is not writable; choose a folder you can write to")
    return path


def create_run_dir(parent: Path, name: str) -> Path:
    """A new, empty run directory ``<parent>/<timestamp>-<name>``: never one that exists already."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    for attempt in range(100):
        path = Path(parent) / (f"{stamp}-{name}" if attempt == 0 else f"{stamp}-{name}-{attempt}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a new run directory for {name!r} under {parent}")


def round_checkpoint(round: int) -> str:
    """File name of the kept checkpoint of ``round``."""
    return f"checkpoint-r{round}.pt"


def kept_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(round, path) of the kept checkpoints in ``run_dir``, oldest first."""
    out = []
    for path in Path(run_dir).glob("checkpoint-r*.pt"):
        number = path.name[len("checkpoint-r"):-len(".pt")]
        if number.isdigit():
            out.append((int(number), path))
    return sorted(out)


def write_atomic(path: Path, text: str) -> None:
    """Replace one of a run directory's own files (config.yaml, summary.json, a rebuilt log)
    atomically: the old file stays until the new one is complete (fdlit.runs.atomic_write)."""
    write_file(path, text, field="run_dir", run_dir=Path(path).parent)


def append_jsonl(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    try:
        with open(path, "a") as f:
            for row in rows:
                f.write(_row_text(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:  # a full disk reports no file from write or fsync: name the one being written
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise


def _row_text(row: dict) -> str:
    return strict_json.dumps(row)


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; unreadable lines (a torn last line, a damaged one) are skipped."""
    return _parse_lines(Path(path))[0]


def read_jsonl_counted(path: Path) -> tuple[list[dict], int]:
    """Rows of a JSON-lines file and how many of its lines were skipped as unreadable (not JSON, not
    an object, nested deeper than ``MAX_JSON_DEPTH``; a torn last line counts too)."""
    rows, bad = _parse_lines(Path(path), keep_torn=True)
    return rows, len(bad)


def _parse_lines(path: Path, keep_torn: bool = False) -> tuple[list[dict], list[int]]:
    """(every readable row, numbers of the unreadable lines other than a torn last one (no newline),
    unless ``keep_torn``). Read a line at a time, so that what is held is the rows and one line, never a
    whole file's text; a line is parsed within ``MAX_JSON_DEPTH`` levels (:func:`load_json`)."""
    if not os.path.lexists(path):
        return [], []
    rows, bad, number, ended = [], [], 0, True
    with open_run_file(path) as (f, limit):
        total = 0
        while True:
            raw = f.readline(MAX_LINE + 1)
            if not raw:
                break
            number += 1
            total += len(raw)
            if total > limit:
                raise RunFileError(path, f"is larger than {limit // MiB} MiB, the most fdlit reads of it")
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                raise RunFileError(path, f"has a line longer than {MAX_LINE // MiB} MiB, the most fdlit reads of one line")
            ended = raw.endswith(b"\n")
            line = raw.decode(errors="replace")
            if not line.strip():
                continue
            try:
                row = load_json(line)
                if not isinstance(row, dict):
                    raise ValueError("not an object")
                rows.append(row)
            except ValueError:
                bad.append(number)
    # a kill mid-write tears the last line before its newline; a complete line that does not parse is damage
    if bad and bad[-1] == number and not ended and not keep_torn:
        bad.pop()
    return rows, bad


def read_config(run_dir: Path) -> dict:
    """A run's saved config as read by sweep and report (bytes that are not UTF-8 do not stop them:
    resuming the run checks the file strictly)."""
    path = Path(run_dir) / CONFIG
    try:
        config = yaml.safe_load(read_run_file(path).decode(errors="replace")) or {}
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise RunFileError(path, "is nested too deeply to read; not a config fdlit writes") from None
    if _expanded_size(config, MAX_CONFIG_VALUES) > MAX_CONFIG_VALUES:  # YAML aliases can nest copies
        raise RunFileError(path, f"expands to more than {MAX_CONFIG_VALUES} values (YAML aliases); not a config "
                           "fdlit writes")
    return config


def read_summary(run_dir: Path) -> dict:
    """A run's summary.json: OSError when there is none, RunFileError when fdlit refuses to read it
    (too large, a link out, nested deeper than ``MAX_JSON_DEPTH``), ValueError when it is not JSON."""
    path = Path(run_dir) / SUMMARY
    text = read_run_file(path).decode(errors="replace")
    check_lines(path, text.split("\n"))
    try:
        return load_json(text)
    except TooDeep as exc:
        raise RunFileError(path, f"is {exc}, not a summary fdlit writes") from None


def rebuild_logs(run_dir: Path, round: int, metrics: list[dict], messages: list[dict]) -> list[str]:
    """Make metrics.jsonl and communication.jsonl hold exactly the checkpoint's rounds 1..``round``
    (``metrics``: the loop's history, ``messages``: its ledger rows), so resumed rounds append to
    them. Rows after ``round`` (a kill between the metrics and the checkpoint writes) and a torn
    last line are dropped: those rounds run again. A file that is damaged anywhere else (an
    unreadable line, a checkpointed row missing or different) is kept as ``<name>.damaged-<time>``
    before it is rewritten. Returns one note per file rebuilt that way."""
    notes = []
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    for name, rows in ((METRICS, metrics), (COMMUNICATION, messages)):
        path = Path(run_dir) / name
        expected = [_row_text(row) for row in rows]
        found, bad = _parse_lines(path)
        # a row with a round that is not a number is damage too: it stays in `kept` and mismatches
        kept = [_row_text(row) for row in found
                if not (isinstance(row.get("round", 0), int) and row.get("round", 0) > round)]
        if path.exists() and (bad or kept != expected):
            copy = path.with_name(f"{name}.damaged-{stamp}")
            shutil.copy2(path, copy)
            what = f"unreadable line(s) {', '.join(map(str, bad[:5]))}" if bad else "rows differ from the checkpoint"
            notes.append(f"{name} was damaged ({what}); rebuilt from the checkpoint ({len(rows)} rows up to "
                         f"round {round}), the damaged file is kept as {copy.name}")
        elif not path.exists() and rows:
            notes.append(f"{name} was missing; rebuilt from the checkpoint ({len(rows)} rows up to round {round})")
        write_atomic(path, "".join(line + "\n" for line in expected))
    return notes


class RunInUse(ConfigError):
    """Another live process holds the run directory's lock."""

    def __init__(self, run_dir: Path, holder: str):
        super().__init__("resume", f"{run_dir} is in use by {holder}; wait for that process to end or stop it "
                         "(the lock goes with the process, also when it is killed)")


class LockNotAFile(ConfigError):
    """Something other than a file is where a run directory's lock file goes."""

    def __init__(self, path: Path, what: str):
        self.path, self.what = Path(path), what
        super().__init__("run_dir", f"{path} is {what}, not fdlit's lock file (fdlit writes it as a plain file); "
                         "remove it and run the command again")


class RunLock:
    """An exclusive lock on a run directory (``flock`` on ``run.lock``), held for the run's life.

    The kernel releases it when the holder exits in any way (including SIGKILL), so a lock is never
    stale; the file keeps the last holder's pid, host and command only to name it in the error a
    second process gets."""

    def __init__(self, run_dir: Path, filename: str = LOCK, in_use: Callable[[Path, str], Exception] = RunInUse):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / filename
        self.in_use = in_use  # the error a second process gets: (folder, who holds it)
        self._file = None

    def acquire(self) -> "RunLock":
        if fcntl is None or self._file is not None:
            return self
        f = os.fdopen(self._open(), "a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            f.close()
            raise self.in_use(self.run_dir, _describe_holder(holder)) from None
        f.seek(0)
        f.truncate()
        f.write(strict_json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "since": datetime.now().isoformat(timespec="seconds"),
                            "command": " ".join(redact_secrets(sys.argv))}) + "\n")
        f.flush()
        self._file = f
        return self

    def _open(self) -> int:
        """The lock file's descriptor; never through a link, and only a regular file (a folder or
        pipe in its place is refused, naming it)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if os.path.islink(self.path):
                raise LockNotAFile(self.path, "a link") from None
            if exc.errno == errno.EISDIR or self.path.is_dir():
                raise LockNotAFile(self.path, "a folder") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LockNotAFile(self.path, "not a regular file (a pipe, socket or device)")
        return fd

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor releases the flock
            self._file = None


# flags whose value is a credential (Flower's ServerApp gets its SuperLink token as --token): the
# lock names its holder's command line for a second process to read, never these values
SECRET_FLAG = re.compile(r"--?[\w.-]*(token|secret|password|passwd|api[-_]?key)[\w.-]*", re.IGNORECASE)


def redact_secrets(argv: list[str]) -> list[str]:
    """``argv`` with the value of every secret flag (``--token X``, ``--token=X``) replaced by ``***``."""
    out, hide = [], False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        out.append("***" if hide else f"{flag}=***" if eq and SECRET_FLAG.fullmatch(flag) else arg)
        hide = not hide and not eq and SECRET_FLAG.fullmatch(arg) is not None
    return out


def _describe_holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on host {h['host']} (since {h['since']}: {h['command']})"
    except (ValueError, KeyError, TypeError):
        return "another process"


class RunDirectory(FederationCallback):
    """Writes the run directory as the federation proceeds. ``messages_written``: ledger messages
    already in communication.jsonl (a resumed run appends only the new ones)."""

    def __init__(self, path: Path, config_yaml: str, identity: dict[str, Any], messages_written: int = 0):
        self.path = Path(path)  # created by create_run_dir (a new run) or the run being resumed
        write_atomic(self.path / CONFIG, config_yaml)
        self.identity = identity  # run name and directory, first in every summary
        self._messages_written = messages_written

    def summary(self, view: RoundView) -> dict[str, Any]:
        return {**self.identity, **view.summary()}

    def on_round_end(self, view: RoundView, round, metrics):
        append_jsonl(self.path / METRICS, [metrics])
        append_jsonl(self.path / COMMUNICATION, view.ledger.rows(self._messages_written))
        self._messages_written = len(view.ledger.messages)
        write_atomic(self.path / SUMMARY, strict_json.dumps(self.summary(view), indent=2))

    def on_fit_end(self, view: RoundView, summary):
        write_atomic(self.path / SUMMARY, strict_json.dumps({**self.identity, **summary}, indent=2))
