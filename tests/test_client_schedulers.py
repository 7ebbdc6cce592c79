"""A ClientModule subclass's own configure_optimizers (federation.client_class) is read as a user's
LightningModule's is: built once per client, its schedulers stepped after each private epoch or
step (the learning rate after R rounds is the scheduler's closed form, under every executor), the
schedule kept in the client's state, and a metric-watching scheduler refused with one line."""

from pathlib import Path

import pytest
import torch

from fdlit.cli import main
from fdlit.clients import ClientModule, ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.execution.vectorized import unsupported_reason
from fdlit.federation import FederationLoop
from fdlit.methods import ProbabilityAveraging
from fdlit.models import MLP
from fdlit.runs import read_jsonl

ROUNDS, FIRST, LATER, STEP_SIZE, GAMMA, LR, PUBLIC_LR = 3, 3, 2, 2, 0.5, 0.01, 0.003


class StepLRClient(ClientModule):
    """SGD with a StepLR every STEP_SIZE epochs."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR)
        return {"optimizer": optimizer,
                "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, STEP_SIZE, GAMMA)}


class PerStepClient(ClientModule):
    """fdlit's own optimizer (``super()``) with an exponential decay after every private step."""

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, GAMMA)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class PlateauClient(ClientModule):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR)
        return [optimizer], [torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)]


class PlainOptimizerClient(ClientModule):
    """Its own optimizer and no scheduler: client.lr / public_lr still set each phase's rate."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=123.0)


def loop_for(client_class, executor, rounds=ROUNDS):
    return FederationLoop(
        rounds=rounds, private_epochs_first=FIRST, private_epochs=LATER, public_epochs_first=1, public_epochs=1,
        executor=executor, client_class=f"{__name__}.{client_class.__name__}",
        data=FederatedData(num_clients=3, classes_per_client=4, public_size=60),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}},
        client=ClientOptimization(optimizer="sgd", lr=LR, public_lr=PUBLIC_LR, batch_size=32),
        aggregator=ProbabilityAveraging(), seed=1,
    )


def lr_of(client):
    return client.configure_optimizers().param_groups[0]["lr"]


@pytest.mark.parametrize("executor", [SequentialExecutor, VectorizedExecutor])
def test_a_subclass_epoch_scheduler_steps_after_each_private_epoch(executor):
    loop = loop_for(StepLRClient, executor())
    loop.fit()
    epochs = FIRST + (ROUNDS - 1) * LATER  # the public phase trains at the rate of that moment
    assert epochs // STEP_SIZE >= 2
    for client in loop.view.clients:
        assert type(client) is StepLRClient
        assert lr_of(client) == pytest.approx(LR * GAMMA ** (epochs // STEP_SIZE))  # StepLR's closed form
        assert client._private_epochs == epochs


def test_a_subclass_step_scheduler_steps_after_each_private_step():
    loop = loop_for(PerStepClient, SequentialExecutor(), rounds=2)
    loop.fit()
    for client, data in zip(loop.view.clients, loop.view.client_data, strict=True):
        n = len(data.train.x)
        per_epoch = sum(1 for start in range(0, n, 32) if n - start >= 2)  # a final batch of one is skipped
        steps = (FIRST + LATER) * per_epoch
        assert client._private_steps == steps
        assert lr_of(client) == pytest.approx(LR * GAMMA ** steps, rel=1e-6)


def test_the_vectorized_executor_trains_a_scheduled_subclass_one_at_a_time():
    client = StepLRClient(MLP((1, 8, 8), 10, hidden=[8]), 0, [0, 1], ClientOptimization())
    assert "on_train_epoch_end" in unsupported_reason(client)
    plain = ClientModule(MLP((1, 8, 8), 10, hidden=[8]), 0, [0, 1], ClientOptimization())
    assert unsupported_reason(plain) is None


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # no optimizer step here
def test_the_optimizer_is_built_once_and_the_schedule_moves_with_the_client_state():
    def client():
        return StepLRClient(MLP((1, 8, 8), 10, hidden=[8]), 0, [0, 1], ClientOptimization())

    a, b = client(), client()
    assert a.configure_optimizers() is a.configure_optimizers()  # every caller gets the one optimizer
    a.set_phase("private")
    for _ in range(2 * STEP_SIZE):
        a.on_train_epoch_end()
    a.set_phase("public")  # the schedulers' rate, not client.public_lr
    assert lr_of(a) == pytest.approx(LR * GAMMA ** 2)
    b.load_client_state(a.client_state())
    assert lr_of(b) == pytest.approx(LR * GAMMA ** 2) and b._private_epochs == 2 * STEP_SIZE
    b.set_phase("private")
    for _ in range(STEP_SIZE):
        b.on_train_epoch_end()
    assert lr_of(b) == pytest.approx(LR * GAMMA ** 3)


def test_without_a_scheduler_client_lr_and_public_lr_still_apply():
    client = PlainOptimizerClient(MLP((1, 8, 8), 10, hidden=[8]), 0, [0, 1], ClientOptimization(lr=LR,
                                                                                                public_lr=PUBLIC_LR))
    client.set_phase("private")
    assert lr_of(client) == LR
    client.set_phase("public")
    assert lr_of(client) == PUBLIC_LR


def test_a_metric_watching_scheduler_is_refused_with_one_line_naming_the_client_class():
    client = PlateauClient(MLP((1, 8, 8), 10, hidden=[8]), 0, [0, 1], ClientOptimization())
    with pytest.raises(ConfigError) as err:
        client.configure_optimizers()
    message = str(err.value)
    assert message.startswith("federation.client_class (PlateauClient.configure_optimizers): ")
    assert "ReduceLROnPlateau" in message and "\n" not in message


def fit_args(run_dir, *extra):
    return ["fit", "--config", str(Path(__file__).resolve().parents[1] / "configs" / "digits_avg.yaml"),
            "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(run_dir),
            "--federation.rounds", str(ROUNDS), "--federation.private_epochs_first", str(FIRST),
            "--federation.private_epochs", str(LATER), "--federation.public_epochs_first", "1",
            "--federation.public_epochs", "1", "--data.num_clients", "3", "--data.classes_per_client", "4",
            "--data.public_size", "60", "--model", "fdlit.models.MLP", "--model.hidden", "[16]",
            "--federation.client_class", f"{__name__}.StepLRClient", *extra]


def test_a_scheduled_subclass_stopped_and_resumed_equals_an_uninterrupted_run(tmp_path):
    """The schedulers' state and epoch count travel in the checkpoint: after a resume the learning
    rate goes on from where it was, so every round's metrics are the uninterrupted run's."""
    assert main(fit_args(tmp_path / "straight")) == 0
    assert main(fit_args(tmp_path / "stopped", "--federation.rounds", "1")) == 0
    (stopped,) = [p for p in (tmp_path / "stopped").iterdir() if p.is_dir()]
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", str(ROUNDS)]) == 0
    (straight,) = [p for p in (tmp_path / "straight").iterdir() if p.is_dir()]

    def rounds(run):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(run / "metrics.jsonl")]

    assert len(rounds(straight)) >= ROUNDS and rounds(stopped) == rounds(straight)
