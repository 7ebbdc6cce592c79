"""A deployment refuses in one line, with nothing left running: a second deploy on the same folders,
a SuperNode that ends before it joins (its own reason), and a node asked to run code its operator
did not allow (the module is never imported on the node)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from fdlit.cli import main as cli_main
from fdlit.runs.directory import RunLock
from tests.deploying import FEW_EPOCHS

pytest.importorskip("flwr", reason="the flower extra is not installed")

SMALL = ["--config", "digits.yaml", "--data.num_clients", "6", "--federation.rounds", "1", "--logger.mode",
         "disabled", "--logger.progress", "false", "--federation.executor", "fdlit.execution.SequentialExecutor",
         *FEW_EPOCHS]


@pytest.mark.parametrize("shared", ["work", "runs"])
def test_a_second_deploy_on_the_same_folder_is_refused(shared, tmp_path, capsys, monkeypatch):
    import fdlit.deployment.launcher as launcher

    monkeypatch.setattr(launcher.LocalDeployment, "start", lambda self: pytest.fail("a process was started"))
    work, runs = tmp_path / "work", tmp_path / "runs"
    held = RunLock(work if shared == "work" else runs, "deploy.lock")  # as the first deploy holds it
    (work if shared == "work" else runs).mkdir()
    held.acquire()
    try:
        assert cli_main(["deploy", "--work-dir", str(work), *SMALL, "--logger.run_dir", str(runs)]) == 2
    finally:
        held.release()
    err = capsys.readouterr().err.strip().splitlines()
    option = "deploy --work-dir" if shared == "work" else "logger.run_dir"
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: {option}: ") and "is in use by the deployment of pid" \
        in err[0] and "give each deployment its own folder" in err[0], err
    assert not [p for p in runs.rglob("*") if p.name != "deploy.lock"]  # no run folder


@pytest.mark.parametrize(("extra", "field", "says"), [
    (("--config", "studies/async_sync.yaml"), "federation.clock", "SynchronousClock runs under fit only"),
    (("--config", "methods/fedavg.yaml", "--config", "studies/async_fedbuff.yaml"), "federation.clock",
     "asynchronous parameter exchange (FedBuff, FedAsync) runs under fit only"),
    (("--config", "studies/async.yaml", "--federation.clock.init_args.buffer", "null",
      "--federation.clock.init_args.period", "5"), "federation.clock.period", "a release period is virtual time"),
])
def test_what_needs_the_virtual_clock_is_refused_before_any_process_starts(extra, field, says, tmp_path, capsys,
                                                                           monkeypatch):
    import fdlit.deployment.launcher as launcher

    monkeypatch.setattr(launcher.LocalDeployment, "start", lambda self: pytest.fail("a process was started"))
    runs = tmp_path / "runs"
    assert cli_main(["deploy", *SMALL, *extra, "--logger.run_dir", str(runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: {field}: {says}"), err


def corrupt_gzip_folder(folder):
    folder.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        (folder / name).write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4)  # a gzip header, then noise
    return f"{folder}/train-images-idx3-ubyte.gz: cannot read it (not a gzip file or a damaged one)"


@pytest.mark.deploy
@pytest.mark.parametrize("folder", ["missing", "corrupt gzip"])
def test_a_supernode_that_ends_before_joining_ends_the_deploy_at_once_with_its_reason(folder, tmp_path, capsys):
    data = tmp_path / "nowhere"
    reason = (f"{data} is not a folder (nor a dotted path of a loader)" if folder == "missing"
              else corrupt_gzip_folder(data))
    started = time.monotonic()
    code = cli_main(["deploy", "--nodes", "2", "--threads", "1", "--node-wait", "300", "--work-dir", str(tmp_path / "w"),
                     "--node-config", f"local-data='{data}'", *SMALL, "--logger.run_dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and time.monotonic() - started < 120, err  # not the 300 s of --node-wait
    assert err[-1].startswith("fdlit deploy: SuperNode "), err
    assert err[-1].endswith(f" exited before it joined (exit code 2): node-config local-data: {reason}; every process "
                            "started here was stopped"), err
    assert not list((tmp_path / "runs").glob("*/config.yaml"))


EVIL = """import os, sys
from pathlib import Path
from fdlit.clients import ClientModule
Path({folder!r}, f"ran-{{os.getpid()}}").write_text(" ".join(sys.argv))
class Client(ClientModule):
    pass
"""


@pytest.mark.deploy
def test_a_deployed_node_never_imports_a_client_class_its_operator_did_not_allow(tmp_path, capsys, monkeypatch):
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "evilmod.py").write_text(EVIL.format(folder=str(code_dir)))
    # every process of the deployment could import it: the node refuses it before importing
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(code_dir), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.syspath_prepend(str(code_dir))
    try:
        code = cli_main(["deploy", "--nodes", "2", "--threads", "1", "--work-dir", str(tmp_path / "w"), *SMALL,
                         "--federation.client_class", "evilmod.Client", "--logger.run_dir", str(tmp_path / "runs")])
    finally:
        sys.modules.pop("evilmod", None)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert "refused 'setup': node-config allowed-classes: the run names ['evilmod.Client'] " \
           "(federation.client_class in " in err[-1], err
    importers = [p.read_text() for p in code_dir.glob("ran-*")]
    assert importers and not [a for a in importers if "fdlit.deployment.node" in a], importers  # the server did, no node
