"""What ``deploy`` watches while a run goes on: SuperNodes joining and leaving (one line each), and
the SuperLink, whose loss ends ``deploy`` within seconds instead of at ``--run-timeout``.

Joins and leaves come from the logs of a local deployment: a SuperNode logs its node id once the
SuperLink has activated it (``SuperNode ID: <id>``), the SuperLink logs a node that deactivates
itself, and a SuperNode process that ends has left. With ``--superlink`` the nodes are other
machines' and are not watched here (the SuperLink's log shows them).
"""

from __future__ import annotations

import re
import socket
import sys
import time
from pathlib import Path

from fdlit.deployment.processes import describe_exit

NODE_ID = re.compile(r"SuperNode ID: (\d+)")
DEACTIVATED = re.compile(r"\[Fleet\.DeactivateNode\] Deactivated node_id=(\d+)")
REMOTE_CHECK_S = 2.0  # how often a remote SuperLink is probed
REMOTE_MISSES = 3  # probes in a row without an answer: it is gone


class SuperLinkLost(RuntimeError):
    """The SuperLink this run was submitted to is gone (its process ended, or it stopped answering)."""


class NodeNeverJoined(RuntimeError):
    """A SuperNode started here ended before it joined: the deployment cannot have its clients. The
    node's own reason (its last ``fdlit: error:`` line, else its log's last line) ends ``deploy``;
    a refusal of its settings (exit status 2) is bad input, as ``deploy``'s own."""

    def __init__(self, index: int, code: int, log: Path):
        self.refused = code == 2
        reason = last_reason(log)
        super().__init__(f"SuperNode {index} exited before it joined ({describe_exit(code)})"
                         + (f": {reason}" if reason else f"; see {log}"))


def last_reason(log: Path, tail_bytes: int = 1 << 16) -> str:
    """A node log's last ``fdlit: error:`` line (without the prefix), else its last line; read from its end."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("fdlit: error: ")]
    return (errors[-1].removeprefix("fdlit: error: ") if errors else lines[-1] if lines else "")[:500]


class LogTail:
    """The lines appended to a file since the last read (a partial last line waits for its end)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode(errors="replace").splitlines()


class DeploymentWatch:
    """``check()``, called while waiting for the run: prints joins and leaves, raises
    :class:`SuperLinkLost`. ``deployment``: the local one (None with ``--superlink``)."""

    def __init__(self, address: str, deployment=None, out=None):
        self.address, self.deployment = address, deployment
        self.out = out or sys.stderr
        self.node_ids: dict[int, str] = {}  # SuperNode index -> its Flower node id, once it joined
        self.gone: set[int] = set()  # SuperNode processes already reported as ended
        self.misses, self.next_probe = 0, 0.0
        work = deployment.work / "logs" if deployment is not None else None
        self.tails = {} if work is None else {i: LogTail(work / f"supernode-{i}.log") for i in range(deployment.nodes)}
        self.superlink_log = None if work is None else LogTail(work / "superlink.log")

    def say(self, text: str) -> None:
        print(f"fdlit deploy: {text}", file=self.out, flush=True)

    def check(self) -> None:
        if self.deployment is not None:
            self.nodes()
            code = self.deployment.processes[0].poll()
            if code is not None:
                raise SuperLinkLost(f"its process ended ({describe_exit(code)})")
        elif time.monotonic() >= self.next_probe:
            self.next_probe = time.monotonic() + REMOTE_CHECK_S
            self.misses = 0 if answers(self.address) else self.misses + 1
            if self.misses >= REMOTE_MISSES:
                raise SuperLinkLost(f"{self.address} stopped answering")

    def nodes(self) -> None:
        for i, tail in self.tails.items():
            for line in tail.lines():
                found = NODE_ID.search(line)
                if found:  # a (re)started SuperNode i: the SuperLink activated it
                    self.node_ids[i] = found.group(1)
                    self.gone.discard(i)
                    self.say(f"SuperNode {i} joined (node id {found.group(1)}, partition {i})")
        for line in self.superlink_log.lines():
            found = DEACTIVATED.search(line)
            for i, node in self.node_ids.items():
                if found and node == found.group(1) and i not in self.gone:
                    self.gone.add(i)
                    self.say(f"SuperNode {i} left (node id {node}: it deactivated itself)")
        for i in range(self.deployment.nodes):
            code = self.deployment.supernode(i).poll()
            if code is not None and i not in self.gone and i not in self.node_ids:
                raise NodeNeverJoined(i, code, self.tails[i].path)
            if code is not None and i not in self.gone:
                self.gone.add(i)
                self.say(f"SuperNode {i} left (node id {self.node_ids.get(i, 'unknown')}: its process ended, "
                         f"{describe_exit(code)})")


def answers(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=REMOTE_CHECK_S):
            return True
    except OSError:
        return False
