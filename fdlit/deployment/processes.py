"""Stopping every process of a local deployment, however deep it was started.

Flower starts processes in sessions of their own (the SuperLink's SuperExec, the node workers), and
those outlive their parent for a while when it is killed, so the process tree and the groups of the
processes the launcher started do not reach them all. Every process the launcher starts carries a
marker in its environment (``FDLIT_DEPLOYMENT=<id>``), which Flower's processes and the node workers
inherit; stopping means: SIGTERM to every marked process's group, a grace period, SIGKILL to what
is left, and waiting until no marked process remains.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

MARKER = "FDLIT_DEPLOYMENT"


def marked(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``FDLIT_DEPLOYMENT=<marker>``, not this one."""
    needle = f"{MARKER}={marker}\0".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes() + b"\0" and state(proc) != "Z":
                found.append(int(proc.name))
        except OSError:  # exited meanwhile, or another user's
            continue
    return found


def state(proc: Path) -> str:
    return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]


def group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def signal_all(pids: set[int], groups: set[int], sig: int) -> None:
    own = os.getpgrp()
    for g in groups - {own, 0, 1}:
        with contextlib.suppress(OSError):
            os.killpg(g, sig)
    for pid in pids - {os.getpid()}:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def stop_processes(started: list[subprocess.Popen], marker: str, grace_s: float = 5.0) -> None:
    """SIGTERM to the groups of ``started`` and of every marked process, SIGKILL after ``grace_s`` to
    what is left (a SuperNode retrying its connection ignores SIGTERM); returns when none is left (or
    after a second ``grace_s``: a process stuck in the kernel cannot be waited for)."""
    groups = {p.pid for p in started if p.poll() is None}
    pids = set(marked(marker)) | groups
    groups |= {g for g in map(group_of, pids) if g is not None}
    signal_all(pids, groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for p in started:
            p.poll()  # reap
        new = set(marked(marker)) - pids  # started meanwhile (a ClientApp for a message in flight)
        if new:
            pids |= new
            groups |= {g for g in map(group_of, new) if g is not None}
            signal_all(new, groups, signal.SIGTERM)
        if all(p.poll() is not None for p in started) and not marked(marker):
            return
        time.sleep(0.1)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left = set(marked(marker))  # only live processes: a pid seen earlier may be another's by now
        unreaped = {p.pid for p in started if p.returncode is None}
        signal_all(left, unreaped | {g for g in map(group_of, left) if g is not None}, signal.SIGKILL)
        for p in started:
            p.poll()
        if all(p.poll() is not None for p in started) and not left:
            return
        time.sleep(0.1)


def describe_exit(code: int | None) -> str:
    """A Popen return code in words: ``exit code 1``, ``killed by SIGKILL``."""
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def peak_rss_bytes(pid: int | str = "self") -> int:
    """Peak resident memory of a process (Linux ``VmHWM``), 0 where unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs; one that ended but is not reaped yet by its parent (a zombie, Linux)
    counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    return True
