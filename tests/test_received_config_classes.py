"""A config received from elsewhere (a run folder given to ``export``, a run submitted to a node) constructs
only the classes of fdlit.configuration.constructible: fdlit's classes that write files are refused in one line before
anything is constructed, and nothing is written outside the run's folder."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fdlit.cli import main

ROOT = Path(__file__).resolve().parents[1]

# fdlit's classes that write files where their arguments say: (class path, init_args with {victim})
WRITERS = {
    "RunDirectory": ("fdlit.runs.directory.RunDirectory",
                     "{path: {victim}, config_yaml: owned, identity: {}}"),
    "Checkpointer": ("fdlit.runs.checkpoint.Checkpointer", "{run_dir: {victim}, config: {}}"),
    "WandbLogger": ("fdlit.runs.wandb_logger.WandbLogger",
                    "{config: {mode: offline}, run_config: {}, directory: {victim}, default_name: x}"),
}
VICTIM_TEXT = "the victim's own config\n"


def with_callback(config: str, name: str, victim: Path) -> str:
    """``config`` (a saved run config) with a writer among its ``federation.callbacks``."""
    class_path, init_args = WRITERS[name]
    entry = f"[{{class_path: {class_path}, init_args: {init_args.replace('{victim}', str(victim))}}}]"
    lines = config.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("callbacks:"))
    lines[at] = lines[at].split("callbacks:")[0] + f"callbacks: {entry}"
    return "\n".join(lines) + "\n"


def make_victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "config.yaml").write_text(VICTIM_TEXT)
    return victim


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("received")
    assert main(["fit", "--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
                 "--logger.run_dir", str(tmp / "runs"), "--federation.rounds", "1",
                 "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
                 "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "100"]) == 0
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir


def export(run: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fdlit", "export", str(run), "--client", "0", "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize("name", list(WRITERS))
def test_export_refuses_each_writing_class_of_fdlit_and_writes_nothing(name, trained_run, tmp_path):
    victim = make_victim(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / "config.yaml").write_text(with_callback((trained_run / "config.yaml").read_text(), name, victim))
    done = export(run, tmp_path / "m.pt")
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: federation.callbacks.class_path: "
                                               f"'{WRITERS[name][0]}' in "), err
    assert "a received config may not construct" in err[0] and err[0].endswith("add --trust_config")
    assert (victim / "config.yaml").read_text() == VICTIM_TEXT and sorted(victim.iterdir()) == [victim / "config.yaml"]
    assert not (tmp_path / "m.pt").exists()


def test_export_compares_the_config_with_its_checkpoint_before_constructing_anything(trained_run, tmp_path):
    """Even trusted (--trust_config), a config.yaml edited since the run is refused before any class of it
    is constructed: the writer it names never runs."""
    victim = make_victim(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / "config.yaml").write_text(with_callback((trained_run / "config.yaml").read_text(), "RunDirectory", victim))
    done = export(run, tmp_path / "m.pt", "--trust_config")
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "differs from the config its checkpoint was written with" in err[0], err
    assert (victim / "config.yaml").read_text() == VICTIM_TEXT


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_node_refuses_each_writing_class_of_fdlit_and_writes_nothing(name, trained_run, tmp_path):
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from fdlit.deployment.node import NodeWorker
    from fdlit.deployment.wire import pack, unpack

    victim = make_victim(tmp_path)
    payload = with_callback((trained_run / "config.yaml").read_text(), name, victim)
    worker = NodeWorker()
    worker.node_config = {"allowed-classes": "mylab."}
    meta, _ = unpack(worker.handle(pack({"op": "setup", "config": payload, "clients": [0], "threads": 1}, {})))
    assert meta["error_kind"] == "ConfigError" and "\n" not in meta["error"]
    assert meta["error"].startswith(f"node-config allowed-classes: the run names ['{WRITERS[name][0]}'] "
                                    "(federation.callbacks.class_path in "), meta["error"]
    assert worker.loop is None
    assert (victim / "config.yaml").read_text() == VICTIM_TEXT and sorted(victim.iterdir()) == [victim / "config.yaml"]


def test_a_node_never_sets_up_ray_for_a_submitted_run():
    from fdlit.deployment.node import check_class_paths
    from fdlit.errors import ConfigError

    with pytest.raises(ConfigError, match="RayExecutor is not set up on a node .*runtime_env installs packages"):
        check_class_paths("federation:\n  executor:\n    class_path: fdlit.execution.RayExecutor\n", "")
    check_class_paths("federation:\n  executor:\n    class_path: fdlit.execution.VectorizedExecutor\n", "")


def test_no_callback_of_fdlit_that_writes_is_constructible():
    """Every FederationCallback fdlit defines outside fdlit.callbacks (the run directory, checkpoints, W&B,
    progress, a sweep's round lines) is refused; the methods, models, executors, attacks and clients the
    shipped configs name are constructible."""
    from fdlit.callbacks import FederationCallback
    from fdlit.configuration.constructible import constructible, full_name

    for module in ("fdlit.runs.directory", "fdlit.runs.checkpoint", "fdlit.runs.wandb_logger", "fdlit.runs.progress",
                   "fdlit.sweeps.stack", "fdlit.runs.experiment"):
        importlib.import_module(module)
    todo, found = list(FederationCallback.__subclasses__()), []
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("fdlit."):
            found.append(full_name(cls))
    assert {w for w, _ in WRITERS.values()} <= set(found)
    assert [n for n in found if constructible(n)] == []
    shipped = ["fdlit.methods.SmoothedUncertaintyWeighted", "fdlit.methods.F2LParams", "fdlit.models.ResNet18",
               "fdlit.models.mutual.MutualPair", "fdlit.execution.VectorizedExecutor", "fdlit.execution.RayExecutor",
               "fdlit.adversaries.LabelFlipping", "fdlit.clients.ClientModule"]
    assert all(constructible(n) for n in shipped)
    assert not constructible("fdlit.aggregators.SmoothedUncertaintyWeightedAggregator")  # no former names
