"""Statements of docs/extending.md and docs/design.md about behaviour, each held by a test that would
fail if the statement were false (the statements other test files do not already hold)."""

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

from fdlit.cli import main
from fdlit.clients import ClientModule, ClientOptimization
from fdlit.errors import ConfigError
from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.execution.selection import select_executor
from fdlit.methods import ProbabilityAveraging
from fdlit.methods.base import ClientPart
from fdlit.models import MLP
from fdlit.privacy import UploadPrivacy
from tests.fitting import GatedVotes

ROOT = Path(__file__).resolve().parents[1]


class NoPublicStep(LightningModule):
    def __init__(self, input_shape=(1, 8, 8), num_classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class WithPublicStep(NoPublicStep):
    """Its public phase is its own: a squared distance to the teacher, not KD."""

    def public_step(self, batch, batch_idx):
        x, probs = batch
        return (self(x).softmax(-1) - probs).pow(2).sum(-1).mean() + batch_idx


def test_an_own_lightning_modules_public_step_is_used_for_the_public_phase_instead_of_kd():
    # extending.md, "Your own LightningModule as the client": Public phase
    g = torch.Generator().manual_seed(0)
    x, probs = torch.randn(6, 1, 8, 8, generator=g), torch.softmax(torch.randn(6, 10, generator=g), -1)
    client = ClientModule(WithPublicStep(), 0, [0, 1], ClientOptimization())
    client.phase = "public"
    own = client.training_step((x, probs), 3)
    assert torch.allclose(own, WithPublicStep.public_step(client.model, (x, probs), 3))
    assert not torch.allclose(own, client.public_loss(client(x), probs))
    plain = ClientModule(NoPublicStep(), 0, [0, 1], ClientOptimization())  # without one: KD towards the teacher
    plain.phase = "public"
    assert torch.allclose(plain.training_step((x, probs), 3), plain.public_loss(plain(x), probs))


def test_predict_features_gives_the_penultimate_features_in_eval_mode():
    # extending.md, "the whole contract": ctx.client.predict_features(x) gives them in eval mode
    torch.manual_seed(0)
    client = ClientModule(MLP((1, 8, 8), 10, hidden=[16], dropout=0.5), 0, [0, 1], ClientOptimization())
    client.train()
    x = torch.randn(5, 1, 8, 8)
    features = client.predict_features(x)
    assert client.training  # the mode it was in comes back
    client.model.eval()
    with torch.no_grad():
        assert torch.equal(features, client.model.embed(x))
    client.model.train()
    with torch.no_grad():
        assert not torch.equal(features, client.model.embed(x))  # dropout: train mode would differ


class AveragesItself(ClientPart):
    rowwise_loss = False

    def __init__(self):
        self.calls = []

    def loss(self, ctx):
        self.calls.append((None if ctx.weight is None else ctx.weight.clone(), len(ctx.logits)))
        return ctx.mean(F.cross_entropy(ctx.logits.float(), ctx.target, reduction="none"))


class RowByRow(AveragesItself):
    rowwise_loss = True

    def loss(self, ctx):
        self.calls.append((ctx.weight, len(ctx.logits)))
        return F.cross_entropy(ctx.logits.float(), ctx.target)


def test_a_loss_that_averages_itself_gets_the_padded_batch_and_its_weights_once():
    # extending.md, "A hook runs under every executor", rule 1: rowwise_loss = False receives ctx.weight
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(4, 10, generator=g), torch.tensor([1, 2, 3, 0])
    weight = torch.tensor([1.0, 1.0, 1.0, 0.0])  # the last row is padding
    client = ClientModule(MLP((1, 8, 8), 10, hidden=[8]), 0, [0, 1], ClientOptimization())
    client.method_part = part = AveragesItself()
    loss = client.private_loss(logits, labels, weight)
    assert len(part.calls) == 1 and torch.equal(part.calls[0][0], weight) and part.calls[0][1] == 4
    assert torch.allclose(loss, F.cross_entropy(logits[:3], labels[:3]))  # padding left out by ctx.mean
    client.method_part = rows = RowByRow()  # the default: one row at a time, real rows averaged, no weight
    assert torch.allclose(client.private_loss(logits, labels, weight), F.cross_entropy(logits[:3], labels[:3]))
    assert all(w is None for w, _ in rows.calls)


class EpochHook(ClientModule):
    def on_train_epoch_end(self):
        super().on_train_epoch_end()


def test_a_client_class_overriding_an_epoch_hook_makes_the_automatic_choice_sequential():
    # extending.md, "Your own LightningModule as the client": overriding an epoch hook makes it sequential
    def clients(cls):
        return [cls(MLP((1, 8, 8), 10, hidden=[8]), i, [0, 1], ClientOptimization()) for i in range(3)]

    assert type(select_executor(clients(ClientModule))) is VectorizedExecutor
    assert type(select_executor(clients(EpochHook))) is SequentialExecutor


def test_an_encoding_is_refused_for_a_method_that_sends_no_logits():
    # extending.md, "1. What a client sends is declared": an encoding for a method that sends no logits
    UploadPrivacy(encoding="hard").check(ProbabilityAveraging(), 10)  # logits: encodable
    with pytest.raises(ConfigError, match=r"^privacy.encoding: 'hard' encodes the public logits, which GatedVotes "
                                          r"does not upload; allowed: full$"):
        UploadPrivacy(encoding="hard").check(GatedVotes(), 10)


def test_a_rule_that_is_not_an_aggregator_is_refused_naming_the_field(tmp_path, capsys):
    # extending.md, "When Python cannot find your class": a class of the wrong kind names the field
    argv = ["fit", "--config", str(ROOT / "configs" / "digits.yaml"), "--aggregator", "collections.OrderedDict",
            "--logger.mode", "disabled", "--logger.run_dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fdlit: error: aggregator") and "Traceback" not in "\n".join(err), err
    assert not list(tmp_path.rglob("metrics.jsonl"))


def test_the_loop_never_branches_on_the_protocol():
    # design.md, "The round, module by module": protocol_for picks the protocol once
    tree = ast.parse((ROOT / "fdlit" / "federation" / "loop.py").read_text())
    words = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(tree)
                                                                           if isinstance(n, ast.Attribute)}
    assert not words & {"predictions", "parameters"}
    assert not {n for n in names if "Exchange" in n or n == "exchange"}


def test_the_loop_has_no_property_that_forwards_to_a_part():
    # design.md, "The round, module by module": the run is read through its parts or its view
    from fdlit.federation import FederationLoop

    assert [name for name, member in vars(FederationLoop).items() if isinstance(member, property)] == []
    assert len((ROOT / "fdlit" / "federation" / "loop.py").read_text().splitlines()) <= 300
