"""The ClientApp: relays each message to this node's worker (:mod:`fdlit.deployment.node`).

Flower runs a ClientApp in a new process per message. This one imports neither torch nor fdlit's
training code: it finds the node worker of this run (a local abstract Unix socket, key-authenticated),
starting it on the first message, hands it the message's records and returns its reply. The worker
watches this SuperNode's processes and exits with them.

Node settings (``flower-supernode --node-config "..."``): ``state-dir`` (where the worker's key, pid
and log live; default: the system's temporary folder), ``idle-timeout`` (seconds without a
message after which an abandoned worker exits; default 1800) and ``data-dir`` (where this machine
keeps the dataset's files, instead of the config's ``data.data_dir``); ``checkpoint-dir``
(where the worker saves its clients' checkpoints: fdlit.deployment.node_checkpoints).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

WORKER_START_TIMEOUT_S = 300.0

app = ClientApp()


def parent_of(pid: int) -> int:
    """The parent process id of ``pid`` (Linux /proc), 0 where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def worker_paths(context: Context) -> tuple[str, Path]:
    """The worker's address (a Linux abstract socket: no file to go stale, no path length limit; the
    key authenticates) and its folder's key file."""
    base = Path(str(context.node_config.get("state-dir") or tempfile.gettempdir()))
    folder = base / f"fdlit-node-{context.run_id}-{context.node_id}"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return f"\0fdlit-node-{context.run_id}-{context.node_id}", folder / "worker.key"


def connect(context: Context, watch: list[int] | None = None):
    """A connection to this node's worker, started here if it is not running yet; the worker exits
    when a process of ``watch`` ends (default: the process that launched this ClientApp and its parent,
    the SuperNode)."""
    from multiprocessing.connection import Client

    sock, key = worker_paths(context)
    with open(key.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one ClientApp at a time starts the worker
        try:
            return Client(sock, family="AF_UNIX", authkey=key.read_bytes())
        except (FileNotFoundError, ConnectionRefusedError):
            pass  # none yet, or it has exited
        write_private(key, secrets.token_bytes(32))
        if watch is None:
            superexec = os.getppid()  # the process that launched this ClientApp; its parent: the SuperNode
            watch = [p for p in (superexec, parent_of(superexec)) if p > 1]
        idle = str(context.node_config.get("idle-timeout", 1800))
        with open(key.with_suffix(".log"), "ab") as log:
            subprocess.Popen([sys.executable, "-m", "fdlit.deployment.node", "--socket", sock.lstrip("\0"),
                              "--authkey-file", str(key), "--idle-timeout", idle, "--watch", *map(str, watch)],
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while True:
            try:
                return Client(sock, family="AF_UNIX", authkey=key.read_bytes())
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the fdlit node worker did not start within {WORKER_START_TIMEOUT_S:g} s "
                                       f"(see {key.with_suffix('.log')})") from None
                time.sleep(0.05)


def write_private(path: Path, data: bytes) -> None:
    """Write a secret readable by its owner only from its creation (no moment with a wider mode)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def relay_message(msg: Message, context: Context, watch: list[int] | None = None) -> Message:
    """Hand a message's records to this node's worker; its reply as a Message."""
    with connect(context, watch) as conn:
        conn.send((msg.content, dict(context.node_config)))
        reply = conn.recv()
    return Message(reply, reply_to=msg)


@app.query("fdlit")
def relay(msg: Message, context: Context) -> Message:
    return relay_message(msg, context)
