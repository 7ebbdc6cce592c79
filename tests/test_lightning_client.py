"""Clients are LightningModules, and a user's own LightningModule federates by class path: its
training_step, its configure_optimizers with a scheduler stepped as Lightning's Trainer steps it,
its self.log values in the run's metrics."""

import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule

from fdlit.clients import ClientModule, ClientOptimization
from fdlit.clients.schedules import read_optimizers, step_schedules
from fdlit.clients.step_log import StepLog
from fdlit.configuration.schema import parse_fit
from fdlit.errors import ConfigError
from fdlit.execution import steps
from fdlit.execution.vectorizable import unsupported_reason
from fdlit.runs.experiment import Experiment

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
EXECUTORS = {"sequential": "fdlit.execution.SequentialExecutor", "vectorized": "fdlit.execution.VectorizedExecutor",
             "ray": "fdlit.execution.RayExecutor"}
ROUNDS, FIRST, LATER, STEP_SIZE, GAMMA, LR = 3, 4, 3, 5, 0.5, 1e-3


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def tiny(tmp_path, *extra, config="configs/digits_avg.yaml"):
    return ["--config", str(ROOT / config), "--config", str(EXAMPLES / "lightning_client.yaml"),
            "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path),
            "--federation.rounds", str(ROUNDS), "--federation.private_epochs_first", str(FIRST),
            "--federation.private_epochs", str(LATER), "--federation.public_epochs_first", "1",
            "--federation.public_epochs", "1", "--data.num_clients", "5", "--data.classes_per_client", "2",
            "--data.public_size", "120", "--model.init_args.hidden", "16",
            "--model.init_args.step_size", str(STEP_SIZE), "--model.init_args.gamma", str(GAMMA), *extra]


def test_client_module_is_a_lightning_module():
    assert issubclass(ClientModule, LightningModule)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # no optimizer step here
def test_configure_optimizers_return_forms_are_read_as_lightning_reads_them():
    p = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD(p, lr=1.0)
    assert read_optimizers(opt) == (opt, [])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    _, schedules = read_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}})
    assert schedules[0].interval == "step" and schedules[0].scheduler is sched
    got, schedules = read_optimizers(([opt], [sched]))
    assert got is opt and schedules[0].interval == "epoch"
    step_schedules(schedules, "step", 1)  # an epoch scheduler does not step per step
    assert opt.param_groups[0]["lr"] == 1.0
    step_schedules(schedules, "epoch", 1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="configure_optimizers"):
        read_optimizers({"lr_scheduler": sched})
    with pytest.raises(ConfigError, match="interval"):
        read_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "batch"}})


def test_self_log_records_outside_vmap_and_nothing_inside():
    log = StepLog()
    log.record("a", torch.tensor(1.0))
    log.record("a", 3.0)
    torch.func.vmap(lambda v: (log.record("b", v), v)[1])(torch.ones(3))
    torch.func.grad(lambda v: (log.record("c", v), v.sum())[1])(torch.ones(3))
    assert log.take() == {"a": 2.0}
    assert log.take() == {}


def test_a_client_modules_self_log_reaches_its_executor():
    from fdlit.execution.executor import SequentialExecutor
    from fdlit.models import MLP

    class Logging(ClientModule):
        def private_loss(self, logits, labels, weight=None):
            loss = super().private_loss(logits, labels, weight)
            self.log("private", loss)
            return loss

    client = Logging(MLP((1, 4, 4), 3, hidden=[8]), 0, [0, 1, 2], ClientOptimization())
    executor = SequentialExecutor()
    from fdlit.execution.device import make_device

    executor.setup(make_device("cpu", "32-true"), [client])
    x, y = torch.randn(20, 1, 4, 4), torch.randint(0, 3, (20,))
    [loss] = executor.train([client], "private", [(x, y)], 1, 10)
    metrics = steps.logged_metrics(executor)
    assert metrics["clients/log/private"] == pytest.approx(loss)  # the mean of the same steps' losses
    assert steps.logged_metrics(executor) == {}  # taken once per round


def lr_after(epochs: int) -> float:
    return LR * GAMMA ** (epochs // STEP_SIZE)  # torch.optim.lr_scheduler.StepLR's closed form


@pytest.mark.parametrize("executor", ["sequential", "ray"])
def test_own_lightning_module_federates_logs_and_schedules(executor, tmp_path, examples_on_path, request):
    extra = ["--federation.executor", EXECUTORS[executor]]
    if executor == "ray":
        request.getfixturevalue("ray_local")
        extra += ["--federation.executor.actor_executor", "sequential"]
    parser, cfg = parse_fit(tiny(tmp_path, *extra))
    experiment = Experiment(cfg, parser)
    experiment.fit()
    loop = experiment.loop
    assert loop.round == ROUNDS and type(loop.view.clients[0].own_module).__name__ == "LitClassifier"
    # the private phase's epochs are the module's epochs: FIRST in round 1, LATER after
    epochs = FIRST + (ROUNDS - 1) * LATER
    assert lr_after(epochs) != LR
    for client in loop.view.clients:
        assert client.configure_optimizers().param_groups[0]["lr"] == pytest.approx(lr_after(epochs))
    rows = [json.loads(line) for line in (experiment.run_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "round" in r]
    assert len(rows) == ROUNDS
    for r in rows:
        assert 0.0 < r["clients/log/train_loss"] < 10.0 and 0.0 <= r["clients/log/train_acc"] <= 1.0
    assert rows[-1]["clients/log/train_loss"] < rows[0]["clients/log/train_loss"]  # it learns


def test_own_lightning_module_runs_sequentially_under_the_vectorized_executor(tmp_path, examples_on_path):
    parser, cfg = parse_fit(tiny(tmp_path, "--federation.executor", EXECUTORS["vectorized"]))
    experiment = Experiment(cfg, parser)
    experiment.setup()
    try:
        reason = unsupported_reason(experiment.loop.view.clients[0])
        assert "LightningModule with its own steps" in reason
    finally:
        experiment.close()


def test_automatic_choice_is_sequential_for_an_own_lightning_module(tmp_path, examples_on_path):
    from fdlit.execution.executor import SequentialExecutor
    from fdlit.execution.selection import select_executor

    parser, cfg = parse_fit(tiny(tmp_path))
    experiment = Experiment(cfg, parser)
    experiment.setup()
    try:
        assert type(select_executor(experiment.loop.view.clients)) is SequentialExecutor
    finally:
        experiment.close()


def test_a_method_with_a_client_loss_is_refused_for_an_own_lightning_module(tmp_path, examples_on_path):
    parser, cfg = parse_fit(tiny(tmp_path, config="configs/digits_fedprox.yaml"))
    experiment = Experiment(cfg, parser)
    with pytest.raises(ConfigError, match="model.class_path"):
        experiment.setup()
    experiment.close()


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # no optimizer step here
def test_the_scheduler_moves_with_the_client_state(examples_on_path):
    from lightning_client import LitClassifier

    def client():
        return ClientModule(LitClassifier((1, 4, 4), 3, hidden=8, step_size=1, gamma=0.5), 0, [0, 1, 2],
                            ClientOptimization())

    a, b = client(), client()
    a.configure_optimizers()
    for _ in range(3):
        a.on_train_epoch_end()  # the private phase's epoch ends: StepLR steps
    b.load_client_state(a.client_state())
    assert b.configure_optimizers().param_groups[0]["lr"] == pytest.approx(LR * 0.5 ** 3)
    b.on_train_epoch_end()
    assert b.configure_optimizers().param_groups[0]["lr"] == pytest.approx(LR * 0.5 ** 4)


def test_logged_values_reach_the_wandb_round_payload():
    from fdlit.runs.dashboards import wandb_round_payload

    payload = wandb_round_payload(None, {"round": 1, "clients/log/train_loss": 0.5, "clients/after_private/acc": [1.0]},
                                  [], trust=False)
    assert payload == {"round": 1, "clients/log/train_loss": 0.5}  # scalars go to W&B, per-client lists do not


def test_a_step_scheduler_steps_per_private_step_and_hooks_run_per_epoch_of_each_phase(examples_on_path):
    from lightning_client import LitClassifier

    from fdlit.execution.device import make_device
    from fdlit.execution.executor import SequentialExecutor

    class PerStep(LitClassifier):
        epochs_started = epochs_ended = 0

        def on_train_epoch_start(self):
            self.epochs_started += 1

        def on_train_epoch_end(self):
            self.epochs_ended += 1

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    own = PerStep((1, 4, 4), 3, hidden=8)
    client = ClientModule(own, 0, [0, 1, 2], ClientOptimization())
    executor = SequentialExecutor()
    executor.setup(make_device("cpu", "32-true"), [client])
    x, y = torch.randn(20, 1, 4, 4), torch.randint(0, 3, (20,))
    executor.train([client], "private", [(x, y)], 2, 10)  # 2 epochs of 2 steps
    assert client.configure_optimizers().param_groups[0]["lr"] == pytest.approx(LR * 0.5 ** 4)
    teacher = torch.full((20, 3), 1 / 3)
    executor.train([client], "public", [(x, teacher)], 1, 10)  # distils forward; the schedule waits
    assert client.configure_optimizers().param_groups[0]["lr"] == pytest.approx(LR * 0.5 ** 4)
    assert own.epochs_started == own.epochs_ended == 3
    assert set(steps.logged_metrics(executor)) == {"clients/log/train_loss", "clients/log/train_acc"}


@pytest.mark.deploy
def test_the_example_lightning_module_federates_deployed_and_its_logs_come_back_from_the_nodes(tmp_path, monkeypatch):
    pytest.importorskip("flwr", reason="the flower extra is not installed")

    from argparse import Namespace

    from fdlit.cli import main as cli_main
    from fdlit.deployment.command import fit_arguments, run_on
    from fdlit.deployment.launcher import LocalDeployment, flower_env

    # the nodes import the example from examples/ (their PYTHONPATH), and their operator allows its module
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    args = [*tiny(tmp_path / "deployed", "--federation.executor", EXECUTORS["sequential"]), "--federation.rounds", "2"]
    dep = LocalDeployment(2, tmp_path / "work", node_settings={"allowed-classes": "lightning_client."})
    dep.start()
    try:
        options = Namespace(nodes=2, timeout=120, node_wait=120.0, run_timeout=600.0, threads=1, root_certificates=None)
        outcome = run_on(dep.address, tmp_path / "work", flower_env(tmp_path / "work"), options, fit_arguments(args)[0])
    finally:
        dep.stop()
    assert outcome["status"] == "done", outcome
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the nodes
    try:
        fit_args = [*tiny(tmp_path / "fit", "--federation.executor", EXECUTORS["sequential"]), "--federation.rounds", "2"]
        assert cli_main(["fit", *fit_args]) == 0
    finally:
        torch.set_num_threads(threads)
    read = lambda run: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    deployed, fitted = read(Path(outcome["run_dir"])), read(next((tmp_path / "fit").iterdir()))
    for d, f in zip(deployed, fitted, strict=True):
        logged = {k for k in f if k.startswith("clients/log/")}
        assert logged == {"clients/log/train_loss", "clients/log/train_acc"} and logged <= set(d)
        for k in [*logged, "after_public/global_acc_mean", "after_private/local_acc_mean"]:
            assert d[k] == pytest.approx(f[k], abs=1e-5), k
