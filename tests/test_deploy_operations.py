"""Operating ``fdlit deploy``: its options checked before any process starts, no process left behind
(normal end, failure, SIGTERM, SIGINT, a lost SuperLink), the run lock without credentials, private
keys created 0600, and the lines that say which SuperNodes joined and left.

The fast tests start no Flower process. The ``deploy`` ones start ``python -m fdlit deploy`` with 2
local SuperNodes on a 6-client digits config and stop it mid-run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import fdlit
from fdlit.cli import main as cli_main
from tests.deploying import FEW_EPOCHS

pytest.importorskip("flwr", reason="the flower extra is not installed")

SMALL = ["--config", "digits.yaml", "--data.num_clients", "6", "--federation.executor",
         "fdlit.execution.SequentialExecutor", "--logger.progress", "false", *FEW_EPOCHS]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


# ---------------------------------------------------------------------- option checks
@pytest.mark.parametrize("options, option, allowed", [
    (["--threads", "-3"], "deploy --threads", "an integer in [0, 1024]"),
    (["--threads", "99999999999999999999"], "deploy --threads", "an integer in [0, 1024]"),
    (["--threads", "two"], "deploy --threads", "invalid int value"),
    (["--timeout", "-5"], "deploy --timeout", "in (0, 3.16224e+07] (a year)"),
    (["--node-wait", "0"], "deploy --node-wait", "in (0, "),
    (["--run-timeout", "-1"], "deploy --run-timeout", "in (0, "),
    (["--run-timeout", "1e308"], "deploy --run-timeout", "in (0, "),
    (["--timeout", "-inf"], "deploy --timeout", "got -inf"),
    (["--nodes", "0"], "deploy --nodes", "an integer in [1, 1024]"),
    (["--nodes", "99999999999"], "deploy --nodes", "an integer in [1, 1024]"),
    (["--nodes", "7"], "deploy --nodes", "between 1 and data.num_clients (6)"),
    (["--superlink", "localhost"], "deploy --superlink", "HOST:PORT"),
    (["--superlink", "127.0.0.1:70000"], "deploy --superlink", "port in 1..65535"),
    (["--node-config", "data-dir='/no/such/folder'"], "deploy --node-config data-dir", "existing folder"),
    (["--node-config", "partition-id=3"], "deploy --node-config partition-id", "set by the launcher"),
])
def test_a_bad_deploy_option_is_one_line_before_any_process_starts(options, option, allowed, tmp_path, capsys,
                                                                     monkeypatch):
    import fdlit.deployment.launcher as launcher

    monkeypatch.setattr(launcher.LocalDeployment, "start", lambda self: pytest.fail("a process was started"))
    monkeypatch.setattr(launcher, "submit", lambda *a: pytest.fail("a run was submitted"))
    assert cli_main(["deploy", *options, *SMALL, "--logger.run_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: {option}: ") and allowed in err[0], err


def test_a_superlink_where_nothing_listens_is_refused_within_seconds(tmp_path, capsys, monkeypatch):
    import fdlit.deployment.launcher as launcher

    monkeypatch.setattr(launcher, "submit", lambda *a: pytest.fail("a run was submitted"))
    port = closed_port()
    started = time.monotonic()
    assert cli_main(["deploy", "--superlink", f"127.0.0.1:{port}", *SMALL, "--logger.run_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"deploy --superlink: nothing listens on 127.0.0.1:{port}" in err[0], err
    assert time.monotonic() - started < 60  # the config check included; the probe itself waits at most 3 s


def test_node_settings_reach_every_local_supernode(tmp_path):
    """--node-config's keys go to each SuperNode started here, beside the launcher's own."""
    from fdlit.deployment.checks import node_settings
    from fdlit.deployment.launcher import LocalDeployment

    data = tmp_path / "data"
    data.mkdir()
    settings = node_settings(f"data-dir='{data}' idle-timeout=60 allowed-classes='fdlit.models.*'")
    assert settings == {"data-dir": str(data), "idle-timeout": 60, "allowed-classes": "fdlit.models.*"}
    dep = LocalDeployment(2, tmp_path / "work", node_settings=settings)
    spawned = []
    dep._spawn = lambda command, env, log: (spawned.append(command), dep.processes.append(None))
    dep.address = "127.0.0.1:1"
    dep._supernode_process(1)
    from flwr.common.config import parse_config_args

    sent = parse_config_args([spawned[0][spawned[0].index("--node-config") + 1]])
    assert sent == {**settings, "partition-id": 1, "num-partitions": 2, "state-dir": str(tmp_path / "work" / "nodes")}


def test_local_nodes_keep_their_checkpoints_beside_the_runs_for_a_fresh_deployment(tmp_path, monkeypatch):
    """deploy's own SuperNodes save their clients' states under logger.run_dir (a resume's temporary
    work folder is new; the runs folder is not); a node-config checkpoint-dir of the user's wins."""
    import fdlit.deployment.command as command

    seen = []
    monkeypatch.setattr(command, "run", lambda options, fit_args: seen.append(dict(options.node_settings)) or 0)
    runs = tmp_path / "runs"
    assert cli_main(["deploy", "--nodes", "2", "--config", "digits.yaml", "--logger.run_dir", str(runs)]) == 0
    assert seen[-1] == {"checkpoint-dir": str(runs.resolve() / ".fdlit-node-checkpoints")}
    mine = tmp_path / "disk"
    assert cli_main(["deploy", "--nodes", "2", "--node-config", f"checkpoint-dir='{mine}'", "--config", "digits.yaml",
                     "--logger.run_dir", str(runs)]) == 0
    assert seen[-1] == {"checkpoint-dir": str(mine)}


# ---------------------------------------------------------------------- keys, lock
def test_a_node_key_is_created_0600_by_the_call_that_creates_it(tmp_path, monkeypatch):
    from fdlit.deployment.launcher import LocalDeployment

    opened, real_open = [], os.open
    monkeypatch.setattr(os, "open", lambda path, flags, mode=0o777, **kw: (opened.append((str(path), flags, mode)),
                                                                           real_open(path, flags, mode, **kw))[1])
    monkeypatch.setattr(Path, "chmod", lambda self, mode: pytest.fail(f"chmod after creation: {self}"))
    monkeypatch.setattr(os, "chmod", lambda *a, **k: pytest.fail("chmod after creation"))
    umask = os.umask(0)  # the most permissive: a file written first and chmod-ed later would be 0666 meanwhile
    try:
        key = LocalDeployment(1, tmp_path).node_key(0)
    finally:
        os.umask(umask)
    created = [(flags, mode) for path, flags, mode in opened if path == str(key)]
    assert created and all(flags & os.O_CREAT and flags & os.O_EXCL and mode == 0o600 for flags, mode in created)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in key.read_bytes()


def test_the_lock_names_its_holder_without_credentials():
    from fdlit.runs.directory import redact_secrets

    argv = ["flwr-serverapp", "--serverappio-api-address", "127.0.0.1:9091", "--token", "s3cr3t", "--insecure",
            "--parent-pid", "42", "--api-key=k3y"]
    assert redact_secrets(argv) == ["flwr-serverapp", "--serverappio-api-address", "127.0.0.1:9091", "--token", "***",
                                    "--insecure", "--parent-pid", "42", "--api-key=***"]


# ---------------------------------------------------------------------- processes, watch
def test_stop_reaches_processes_started_in_sessions_of_their_own(tmp_path):
    """Flower's SuperExec and the node workers start in new sessions, outside the group of the process
    the launcher started; stop() still ends them, a SIGTERM-deaf one by SIGKILL."""
    from fdlit.deployment.launcher import LocalDeployment

    dep = LocalDeployment(1, tmp_path)
    (tmp_path / "logs").mkdir()
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    parent = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {deaf!r}], "
              f"start_new_session=True); open({str(tmp_path / 'child')!r}, 'w').write(str(p.pid)); time.sleep(600)")
    dep._spawn([sys.executable, "-c", parent], dict(os.environ), tmp_path / "logs" / "parent.log")
    deadline = time.monotonic() + 60
    while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child = int((tmp_path / "child").read_text())
    try:
        dep.stop(grace_s=1.0)
        assert dep.processes[0].returncode is not None
        assert not running(child)
    finally:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)  # the test leaves nothing behind either


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Exited:
    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code


def test_the_watch_says_which_nodes_joined_and_left_and_notices_a_lost_superlink(tmp_path):
    import io

    from fdlit.deployment.watch import DeploymentWatch, SuperLinkLost

    logs = tmp_path / "logs"
    logs.mkdir()
    superlink, nodes = Exited(), [Exited(), Exited()]
    dep = SimpleNamespace(work=tmp_path, nodes=2, processes=[superlink, *nodes], supernode=lambda i: nodes[i])
    out = io.StringIO()
    watch = DeploymentWatch("127.0.0.1:1", dep, out)
    (logs / "supernode-0.log").write_text("INFO :      Starting Flower SuperNode\nINFO :      SuperNode ID: 111\n")
    (logs / "supernode-1.log").write_text("INFO :      SuperNode ID: 222\n")
    (logs / "superlink.log").write_text("INFO :      [Fleet.ActivateNode] Activated node_id=111\n")
    watch.check()
    watch.check()  # nothing new: no line twice
    assert out.getvalue().splitlines() == ["fdlit deploy: SuperNode 0 joined (node id 111, partition 0)",
                                           "fdlit deploy: SuperNode 1 joined (node id 222, partition 1)"]
    with open(logs / "superlink.log", "a") as f:
        f.write("INFO :      [Fleet.DeactivateNode] Deactivated node_id=222\n")
    nodes[0].code = -9
    watch.check()
    assert sorted(out.getvalue().splitlines()[2:]) == [
        "fdlit deploy: SuperNode 0 left (node id 111: its process ended, killed by SIGKILL)",
        "fdlit deploy: SuperNode 1 left (node id 222: it deactivated itself)"]
    watch.check()  # each leave said once
    assert len(out.getvalue().splitlines()) == 4
    superlink.code = -9
    with pytest.raises(SuperLinkLost, match="its process ended"):
        watch.check()


def test_a_remote_superlink_that_stops_answering_is_lost_within_seconds(monkeypatch):
    import fdlit.deployment.watch as watch_module

    monkeypatch.setattr(watch_module, "REMOTE_CHECK_S", 0.05)
    watch = watch_module.DeploymentWatch(f"127.0.0.1:{closed_port()}")
    started = time.monotonic()
    with pytest.raises(watch_module.SuperLinkLost, match="stopped answering"):
        while time.monotonic() - started < 10:
            watch.check()
            time.sleep(0.01)


# ---------------------------------------------------------------------- a real deploy, stopped
def mentioning(text: str) -> list[str]:
    """Live processes whose command line or environment mentions ``text``, as their command lines."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                seen = cmdline + (proc / "environ").read_bytes()
                alive = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                continue
            if text.encode() in seen and alive:
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


class Deploy:
    """``python -m fdlit deploy`` in a subprocess (its own session, as from a shell), its stderr in a file."""

    def __init__(self, tmp_path: Path, extra: list[str]):
        self.work, self.runs, self.err_file = tmp_path / "work", tmp_path / "runs", tmp_path / "deploy.err"
        env = {**os.environ, "PYTHONPATH": str(Path(fdlit.__file__).resolve().parent.parent)}  # this fdlit
        with open(self.err_file, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fdlit", "deploy", "--nodes", "2", "--threads", "1", "--work-dir", str(self.work),
                 *SMALL, "--logger.run_dir", str(self.runs), *extra],
                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def err(self) -> str:
        return self.err_file.read_text(errors="replace")

    def wait_for(self, what, timeout: float = 600):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = what()
            if found:
                return found
            assert self.process.poll() is None, f"deploy ended ({self.process.returncode}): {self.err()}"
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"waited {timeout} s in vain: {self.err()}")

    def kill(self):
        """Whatever is left once the test is over (nothing, when deploy did its job)."""
        with_work = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and in_env(p, str(self.work))]
        for pid in [self.process.pid, *with_work]:
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        self.process.wait()

    def run_dir(self) -> Path | None:
        found = [d for d in self.runs.glob("*") if (d / "run.lock").exists()] if self.runs.exists() else []
        return found[0] if found else None

    def left_behind(self) -> list[str]:
        """What still runs of this deployment (its work folder is in every such process's environment)."""
        return mentioning(str(self.work))


def in_env(proc: Path, text: str) -> bool:
    try:
        return text.encode() in (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
    except OSError:
        return False


def serverapp_token(work: Path) -> str | None:
    for line in mentioning(str(work)):
        found = re.search(r"flwr-serverapp .*--token (\S+)", line)
        if found:
            return found.group(1)
    return None


@pytest.mark.deploy
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_every_process_of_the_deployment(sig, tmp_path):
    """Once the SuperNodes joined (SIGINT) or the ServerApp holds the run directory (SIGTERM: its lock
    is checked for the SuperLink token first), a stop signal ends deploy with 128 + the signal's number,
    one line, and no process of the deployment left."""
    deploy = Deploy(tmp_path, ["--federation.rounds", "3"])
    try:
        deploy.wait_for(lambda: "SuperNode 0 joined" in deploy.err() and "SuperNode 1 joined" in deploy.err())
        if sig == signal.SIGTERM:
            run_dir = deploy.wait_for(deploy.run_dir)
            token = deploy.wait_for(lambda: serverapp_token(deploy.work))
            lock = deploy.wait_for(lambda: (run_dir / "run.lock").read_text())
            assert "flwr-serverapp" in lock and "--token ***" in lock and token not in lock, lock
        assert deploy.left_behind()  # the deployment runs
        deploy.process.send_signal(sig)
        code = deploy.process.wait(timeout=120)
    finally:
        deploy.kill()
    name = signal.Signals(sig).name
    assert code == 128 + sig, deploy.err()
    stopped = [line for line in deploy.err().splitlines() if "stopped by" in line]
    assert len(stopped) == 1 and stopped[0].startswith(f"fdlit deploy: stopped by {name}; every process"), deploy.err()
    assert "Traceback" not in deploy.err()
    assert deploy.left_behind() == []


@pytest.mark.deploy
def test_a_killed_serverapp_ends_deploy_within_seconds(tmp_path):
    """The ServerApp on this machine is watched as a process: killed mid-run (no outcome written), deploy
    says so and stops everything within seconds, not at the SuperLink's next status check."""
    deploy = Deploy(tmp_path, ["--federation.rounds", "200"])
    try:
        run_dir = deploy.wait_for(deploy.run_dir)
        deploy.wait_for(lambda: (run_dir / "metrics.jsonl").exists())  # round 1 done
        said = json.loads(deploy.wait_for(lambda: read(deploy.work / "result.serverapp.json")))
        assert b"flwr-serverapp" in read(Path(f"/proc/{said['pid']}/cmdline"))
        os.kill(said["pid"], signal.SIGKILL)
        killed = time.monotonic()
        code = deploy.process.wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        deploy.kill()
    assert code == 1 and took < 30, (code, took, deploy.err())
    failed = [line for line in deploy.err().splitlines() if "the ServerApp exited without an outcome" in line]
    assert len(failed) == 1 and failed[0].startswith("fdlit deploy: the run failed: "), deploy.err()
    assert deploy.left_behind() == []


@pytest.mark.deploy
def test_a_lost_superlink_ends_deploy_within_seconds_and_says_what_was_kept(tmp_path):
    deploy = Deploy(tmp_path, ["--federation.rounds", "3"])
    try:
        run_dir = deploy.wait_for(deploy.run_dir)
        deploy.wait_for(lambda: (run_dir / "checkpoint.pt").exists())  # round 1 saved
        superlink = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and
                     b"fdlit.deployment.superlink" in read(p / "cmdline") and in_env(p, str(deploy.work))]
        assert len(superlink) == 1
        os.killpg(os.getpgid(superlink[0]), signal.SIGKILL)
        lost = time.monotonic()
        code = deploy.process.wait(timeout=60)
        took = time.monotonic() - lost
    finally:
        deploy.kill()
    assert took < 30 and code == 1, (took, code, deploy.err())
    gone = [line for line in deploy.err().splitlines() if "SuperLink is gone" in line]
    assert len(gone) == 1 and f"`python -m fdlit deploy --resume {run_dir}` continues it" in gone[0], deploy.err()
    assert "killed by SIGKILL" in gone[0]
    assert "Traceback" not in deploy.err()
    assert deploy.left_behind() == []
    # the completed round resumes on a fresh deployment, and the run is then a 3-round fit's
    env = {**os.environ, "PYTHONPATH": str(Path(fdlit.__file__).resolve().parent.parent)}
    resumed = subprocess.run([sys.executable, "-m", "fdlit", "deploy", "--nodes", "2", "--threads", "1", "--work-dir",
                              str(tmp_path / "work2"), "--resume", str(run_dir)],
                             capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the nodes
    try:
        assert cli_main(["fit", *SMALL, "--federation.rounds", "3", "--logger.run_dir", str(tmp_path / "fit")]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = lambda run: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    deployed, fitted = rows(run_dir), rows(next((tmp_path / "fit").iterdir()))
    assert [r["round"] for r in deployed] == [1, 2, 3]
    for d, f in zip(deployed, fitted, strict=True):
        for key in ("after_private/global_acc_mean", "after_public/global_acc_mean", "teacher/acc", "comm/up_bytes"):
            assert abs(d[key] - f[key]) < 1e-5, (d["round"], key)


def read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
