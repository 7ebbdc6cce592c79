"""The examples in examples/ run as a user runs them: by class path, from outside the package."""

import sys
from pathlib import Path

import pytest
import torch

from fdlit.configuration.schema import parse_fit
from fdlit.runs.experiment import Experiment

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXECUTORS = {"sequential": "fdlit.execution.SequentialExecutor", "vectorized": "fdlit.execution.VectorizedExecutor",
             "ray": "fdlit.execution.RayExecutor"}


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as `cd examples` or PYTHONPATH=examples does


def tiny(tmp_path, *extra):
    return ["--config", "digits.yaml", "--config", str(EXAMPLES / "median_teacher.yaml"),
            "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path),
            "--federation.rounds", "2", "--federation.private_epochs_first", "2", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1", "--data.num_clients", "5", "--data.classes_per_client", "6",
            "--data.public_size", "120", "--model.hidden", "[16]", *extra]


def test_the_median_teacher_is_the_median_of_the_clients_probabilities(examples_on_path):
    from median_teacher import MedianTeacher

    probs = torch.tensor([[[0.7, 0.3]], [[0.6, 0.4]], [[0.1, 0.9]]])  # 3 clients, 1 sample, 2 classes
    result = MedianTeacher().aggregate([{"logits": p.log()} for p in probs], None)
    torch.testing.assert_close(result.teacher, torch.tensor([[0.6, 0.4]]))  # the outlier moves nothing


@pytest.mark.parametrize("executor", ["sequential", "vectorized", "ray"])
def test_the_median_teacher_runs_by_class_path_under_every_executor(executor, tmp_path, examples_on_path, request):
    extra = ["--federation.executor", EXECUTORS[executor]]
    if executor == "ray":
        request.getfixturevalue("ray_local")
        extra += ["--federation.executor.actor_executor", "sequential"]
    parser, cfg = parse_fit(tiny(tmp_path, *extra))
    loop = Experiment(cfg, parser).loop
    assert type(loop.server_side.method).__module__ == "median_teacher"
    assert "median_teacher" not in sys.modules["fdlit"].__dict__
    loop.fit()
    assert loop.round == 2 and loop.history[-1]["teacher/acc"] > 0.3  # most clients hold each class: the median knows it


def test_fednova_with_equal_local_steps_is_fedavg_and_with_unequal_steps_is_not(examples_on_path):
    """x <- x - tau_eff sum_i p_i d_i: with every tau_i = tau the result is sum_i p_i y_i (FedAvg)."""
    from fednova import FedNova

    from fdlit.methods.base import FederationInfo, ServerContext

    x, ys = torch.zeros(4), [torch.tensor([1.0, 2.0, 0.0, -1.0]), torch.tensor([3.0, 0.0, 1.0, 1.0])]
    method = FedNova()
    method.counts, method.global_model = torch.tensor([1, 3]), x.clone()
    ctx = ServerContext(FederationInfo(1, 0, 2, 2, torch.zeros(1, 1)))

    def uploads(taus):
        return [{"normalised_update": (x - y) / t, "local_steps": torch.tensor(t)} for y, t in zip(ys, taus, strict=True)]

    fedavg = 0.25 * ys[0] + 0.75 * ys[1]
    torch.testing.assert_close(method.aggregate(uploads([5, 5]), ctx).broadcast["parameters"], fedavg)
    method.global_model = x.clone()
    nova = method.aggregate(uploads([2, 8]), ctx)  # tau_eff = 0.25*2 + 0.75*8 = 6.5
    assert nova.stats["fednova/tau_eff"] == 6.5
    torch.testing.assert_close(nova.broadcast["parameters"], -6.5 * (0.25 * (x - ys[0]) / 2 + 0.75 * (x - ys[1]) / 8))


@pytest.mark.parametrize("executor", ["sequential", "vectorized", "ray"])
def test_fednova_runs_by_class_path_under_every_executor_and_resumes(executor, tmp_path, examples_on_path, request):
    """A client part (its own upload and receive) and a server part (its own state) from outside the
    package: the Ray actors get the client part, and the server's x is checkpointed."""
    extra = ["--federation.executor", EXECUTORS[executor]]
    if executor == "ray":
        request.getfixturevalue("ray_local")
        extra += ["--federation.executor.actor_executor", "sequential"]
    argv = ["--config", "digits_fedavg.yaml", "--config", str(EXAMPLES / "fednova.yaml"), "--logger.mode", "disabled",
            "--logger.progress", "false", "--logger.run_dir", str(tmp_path), "--federation.rounds", "2",
            "--federation.private_epochs_first", "2", "--federation.private_epochs", "1", "--data.num_clients", "5",
            "--data.public_size", "100", "--model.hidden", "[16]", *extra]
    parser, cfg = parse_fit(argv)
    loop = Experiment(cfg, parser).loop
    loop.fit()
    assert loop.round == 2 and loop.history[-1]["fednova/tau_eff"] > 0
    assert loop.history[-1]["after_public/global_acc_mean"] > 0.2
    state = loop.state_dict()["method"]
    assert torch.equal(state["global_model"], loop.server_side.method.global_model)


def test_a_class_path_python_cannot_find_says_how_python_finds_a_users_module(fast_args, capsys):
    from fdlit.cli import main

    assert main(["fit", *fast_args, "--aggregator", "my_missing_rules.MedianTeacher"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fdlit: error: aggregator") and "my_missing_rules" in err and "PYTHONPATH" in err
    assert main(["fit", *fast_args, "--aggregator", "fdlit.methods.NoSuchRule"]) == 2
    assert "PYTHONPATH" not in capsys.readouterr().err  # a typo in fdlit's own path is no path problem


def test_the_shipped_fednova_example_differs_from_fedavg_on_the_same_clients(tmp_path, examples_on_path, capsys):
    """With examples/fednova.yaml as shipped the clients take different numbers of local steps, so
    FedNova's model is not FedAvg's (on the classes partition both are the same to the bit)."""
    import json

    from fdlit.cli import main

    common = ["--logger.mode", "disabled", "--logger.progress", "false", "--federation.rounds", "2",
              "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
              "--data.num_clients", "5", "--data.public_size", "100"]

    def run(name, *config):
        assert main(["fit", "--config", "digits_fedavg.yaml", *config, *common,
                     "--logger.run_dir", str(tmp_path / name)]) == 0
        (folder,) = (tmp_path / name).iterdir()
        return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]

    import yaml

    shipped = yaml.safe_load((EXAMPLES / "fednova.yaml").read_text())
    same_clients = tmp_path / "same_clients.yaml"  # everything the example sets but its method
    same_clients.write_text(yaml.safe_dump({k: v for k, v in shipped.items() if k != "aggregator"}))
    nova = run("fednova", "--config", str(EXAMPLES / "fednova.yaml"))
    fedavg = run("fedavg", "--config", str(same_clients))
    steps = nova[-1]["fednova/tau_eff"]
    assert steps > 0
    assert [r["after_public/global_acc_mean"] for r in nova] != [r["after_public/global_acc_mean"] for r in fedavg]


def test_runs_made_from_the_examples_folder_are_ignored_by_git():
    """The examples are run from examples/: their run and W&B folders are not the project's files."""
    import shutil
    import subprocess

    root = EXAMPLES.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["examples/runs/x/metrics.jsonl", "examples/wandb/offline-run/x", "runs/x", "fdlit/runs/naming.py"]
    out = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=root, capture_output=True, text=True).stdout
    assert out.split() == paths[:3]  # and fdlit's own runs package is never ignored
