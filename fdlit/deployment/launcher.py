"""``python -m fdlit deploy``: a local Flower deployment (SuperLink + N SuperNodes on 127.0.0.1), or
an existing SuperLink, and a ``fit`` run submitted to it as a Flower App.

The App is generated per run in a work folder: a ``pyproject.toml`` naming fdlit's ServerApp and
ClientApp and carrying the run config (the ``fit`` arguments, the node count, the timeouts), built
into a FAB and submitted by ``flwr run``. Flower's own processes (SuperLink, SuperNodes, their
SuperExec, the ServerApp and ClientApp processes, fdlit's node workers) all import the fdlit this
process imported (``PYTHONPATH``). Every process started here is stopped when the run ends, fails
or is interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import fdlit
from fdlit.deployment.processes import MARKER, alive, stop_processes

CONNECTION = "fdlit"  # the SuperLink connection's name in the generated Flower config


def flower_bin(name: str) -> str:
    """A Flower command from the running Python's environment (else from PATH)."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        from fdlit.deployment import INSTALL_HINT

        raise FileNotFoundError(f"'{name}' not found: Flower is not installed here. Install it with: {INSTALL_HINT}")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before listening on port {port}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on port {port} within {timeout_s:g} s")
        time.sleep(0.1)


def flower_env(work: Path) -> dict[str, str]:
    """Flower's processes: this fdlit first on the path, Flower's state in the work folder, quick polling."""
    env = dict(os.environ)
    root = str(Path(fdlit.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env["FLWR_HOME"] = str(work / "flwr-home")
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")  # how soon a message starts a ClientApp
    return env


@dataclass
class LocalDeployment:
    """A SuperLink and ``nodes`` SuperNodes on 127.0.0.1, each in its own process group."""

    nodes: int
    work: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    address: str = ""
    # (CA certificate, SuperLink certificate, its key), PEM files: TLS on every connection; None: --insecure
    certificates: tuple[Path, Path, Path] | None = None
    # SuperNode authentication (needs ``certificates``): each SuperNode gets an EC key whose public half
    # is registered with the SuperLink (``flwr supernode register``); unregistered nodes are refused
    authenticate: bool = False
    # Flower's own SuperLink (``flower-superlink``) instead of fdlit.deployment.superlink: for comparisons
    flower_superlink: bool = False
    # more --node-config for every SuperNode (data-dir, idle-timeout, allowed-classes, ...; checked by
    # fdlit.deployment.checks.node_settings)
    node_settings: dict = field(default_factory=dict)
    # in every process started here and inherited by what they start: how stop() finds them all
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)

    def _security(self, server: bool) -> list[str]:
        if self.certificates is None:
            return ["--insecure"]
        ca, cert, key = (str(Path(f).resolve()) for f in self.certificates)
        return ["--ssl-ca-certfile", ca, "--ssl-certfile", cert, "--ssl-keyfile", key] if server else [
            "--root-certificates", ca]

    def start(self, timeout_s: float = 60.0) -> None:
        env = flower_env(self.work)
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        auth = ["--enable-supernode-auth"] if self.authenticate else []
        flower = flower_bin("flower-superlink")  # Flower installed (else: how to install it)
        command = [flower] if self.flower_superlink else [sys.executable, "-m", "fdlit.deployment.superlink"]
        # its SuperExec only starts the ServerApp: asking twice a second, not ten times (each ask is a
        # request the SuperLink serves, all run long)
        slower = {} if "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" in os.environ else {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5"}
        self._spawn([*command, *self._security(True), *auth, "--host", "127.0.0.1", "--port", str(port),
                     "--disable-runtime-dependency-installation"], {**env, **slower}, logs / "superlink.log")
        wait_for_port(port, self.processes[0], timeout_s, "flower-superlink")
        if self.authenticate:
            write_connection(env, self.address, str(self.certificates[0]))
            for i in range(self.nodes):
                self.register_node_key(self.node_key(i), env)
        for i in range(self.nodes):
            self.processes.append(self._supernode_process(i))
        for i, p in enumerate(self.processes[1:]):
            if p.poll() is not None:
                raise RuntimeError(f"flower-supernode {i} exited with code {p.returncode} (see {logs})")

    def node_key(self, i: int) -> Path:
        """SuperNode i's private EC key (OpenSSH format, made on first use), its public key beside it (.pub)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        path = self.work / "keys" / f"supernode-{i}"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            key = ec.generate_private_key(ec.SECP384R1())
            write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                  serialization.NoEncryption()))
            path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
        return path

    def register_node_key(self, key: Path, env: dict) -> None:
        done = subprocess.run([flower_bin("flwr"), "supernode", "register", str(key.with_suffix(".pub")), CONNECTION],
                              env=env, capture_output=True, text=True, cwd=self.work, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"flwr supernode register failed: {done.stdout.strip()} {done.stderr.strip()}")

    def _supernode_process(self, i: int) -> subprocess.Popen:
        settings = {"state-dir": str(self.work / "nodes"), **self.node_settings, "partition-id": i,
                    "num-partitions": self.nodes}
        node_config = " ".join(f"{k}={toml_value(v)}" for k, v in settings.items())
        key = ["--auth-supernode-private-key", str(self.node_key(i))] if self.authenticate else []
        # fdlit's SuperNode (fdlit.deployment.supernode): ClientApp tasks in one long-lived thread, short waits
        flower_bin("flower-supernode")  # Flower installed (else: how to install it)
        self._spawn([sys.executable, "-m", "fdlit.deployment.supernode", *self._security(False), *key, "--superlink", self.address,
                     "--host", "127.0.0.1", "--port", str(free_port()), "--node-config", node_config],
                    flower_env(self.work), self.work / "logs" / f"supernode-{i}.log")
        return self.processes.pop()

    def restart_supernode(self, i: int) -> subprocess.Popen:
        """A new SuperNode with partition ``i`` (after the old one died): it takes over that
        partition's clients at the next round (FlowerExecutor)."""
        old = self.processes[1 + i]
        self.processes[1 + i] = self._supernode_process(i)
        self.processes.append(old)  # still stopped and reaped with the rest
        return self.processes[1 + i]

    def _spawn(self, command: list[str], env: dict, log: Path) -> None:
        env = {**env, MARKER: self.marker}
        with open(log, "ab") as out:
            self.processes.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, cwd=self.work, start_new_session=True))

    def supernode(self, i: int) -> subprocess.Popen:
        return self.processes[1 + i]

    def stop(self, grace_s: float = 5.0) -> None:
        """Every process of the deployment stopped: the SuperLink, the SuperNodes and what they
        started (SuperExecs, ServerApp, ClientApps, node workers), SIGKILL after ``grace_s``
        (fdlit.deployment.processes)."""
        stop_processes(self.processes, self.marker, grace_s)
        for p in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=grace_s)


def write_private(path: Path, data: bytes) -> None:
    """A new file only its owner can read, mode 0600 from its creation (no moment with a wider one)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, 0o600)  # the umask may have taken the owner's bits away; never adds others'
        f.write(data)


def toml_value(v) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v).lower() if isinstance(v, bool) else repr(v)


def write_app(folder: Path, run_config: dict) -> Path:
    """The Flower App of one run: fdlit's ServerApp and ClientApp, and the run config."""
    folder.mkdir(parents=True, exist_ok=True)
    config = "\n".join(f"{k} = {toml_value(v)}" for k, v in run_config.items())
    (folder / "pyproject.toml").write_text(f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fdlit-run"
version = "{fdlit.__version__ if hasattr(fdlit, '__version__') else '0.1.0'}"
description = "an fdlit fit run as a Flower App"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "fdlit"

[tool.flwr.app.components]
serverapp = "fdlit.deployment.server_app:app"
clientapp = "fdlit.deployment.client_app:app"

[tool.flwr.app.config]
{config}
""")
    return folder


def write_connection(env: dict, address: str, root_certificates: str | None) -> None:
    home = Path(env["FLWR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    tls = f'root-certificates = {json.dumps(str(Path(root_certificates).resolve()))}' if root_certificates else \
        "insecure = true"
    (home / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                                      f'address = "{address}"\n{tls}\n')


def submit(app: Path, env: dict) -> int:
    """``flwr run``: build the App into a FAB and start it on the SuperLink; returns the run id."""
    done = subprocess.run([flower_bin("flwr"), "run", str(app), CONNECTION, "--format", "json"], env=env,
                          capture_output=True, text=True, cwd=app, timeout=300)
    try:
        reply = json.loads(done.stdout)
    except json.JSONDecodeError:
        reply = {}
    if done.returncode != 0 or not reply.get("success", "run-id" in reply):
        raise RuntimeError(f"flwr run failed: {done.stdout.strip()} {done.stderr.strip()}")
    return int(reply["run-id"])


def run_status(run_id: int, env: dict) -> str:
    """The run's status as ``flwr ls`` reports it (e.g. ``running``, ``finished:completed``); empty
    where the SuperLink did not say (a lost SuperLink is the watch's to report)."""
    try:
        done = subprocess.run([flower_bin("flwr"), "ls", CONNECTION, "--run-id", str(run_id), "--format", "json"],
                              env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return ""
    try:
        runs = json.loads(done.stdout).get("runs", [])
        return str(runs[0].get("status", "")) if runs else ""
    except (json.JSONDecodeError, AttributeError, IndexError):
        return ""


def stop_run(run_id: int, env: dict) -> None:
    """``flwr stop``: end the run on the SuperLink (its ServerApp and ClientApps)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run([flower_bin("flwr"), "stop", str(run_id), CONNECTION], env=env, capture_output=True, timeout=30)


def serverapp_file(result_file: Path) -> Path:
    """Where the ServerApp says which process it is (beside its result file): host and pid."""
    return result_file.with_name(result_file.stem + ".serverapp.json")


def serverapp_alive(result_file: Path) -> bool | None:
    """Whether the run's ServerApp process still runs: None where that cannot be seen from here (not
    started yet, or on another machine), so the SuperLink is asked instead."""
    try:
        said = json.loads(serverapp_file(result_file).read_text())
        if said.get("host") != socket.gethostname():
            return None
        return alive(int(said["pid"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def wait_for_result(result_file: Path, run_id: int, env: dict, timeout_s: float,
                    watch: Callable[[], None] | None = None) -> dict:
    """The ServerApp's outcome: its result file, or the run's failure as the SuperLink reports it.
    ``watch``: called every 0.2 s meanwhile (node lines, the SuperLink's loss). A ServerApp on this
    machine is watched as a process (its end is seen within 0.2 s); one elsewhere through ``flwr
    ls`` every 10 s (a Python process of its own: ~1 CPU-second each, which a round beside it feels)."""
    deadline, next_check = time.monotonic() + timeout_s, time.monotonic() + 10
    while not result_file.exists():
        if watch is not None:
            watch()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the run did not finish within {timeout_s:g} s (deploy --run-timeout)")
        alive = serverapp_alive(result_file)
        if alive is False:  # it exited: its result is written before it does, so none now is a failure
            time.sleep(1)
            if result_file.exists():
                break
            status = run_status(run_id, env) or "not reported"
            return {"status": "failed", "error": f"the ServerApp exited without an outcome (Flower: {status})"}
        if alive is None and time.monotonic() > next_check:  # a ServerApp that died without writing its outcome
            status = run_status(run_id, env)
            if status.startswith("finished"):
                time.sleep(1)
                if result_file.exists():
                    break
                if status == "finished:completed":  # the ServerApp ran on another machine
                    return {"status": "done", "remote": True}
                return {"status": "failed", "error": f"the Flower run ended ({status})"}
            next_check = time.monotonic() + 10
        time.sleep(0.2)
    return json.loads(result_file.read_text())


@contextmanager
def work_folder(keep: str | None) -> Iterator[Path]:
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep).resolve()
        return
    folder = Path(tempfile.mkdtemp(prefix="fdlit-deploy-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
