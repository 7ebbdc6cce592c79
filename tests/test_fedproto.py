"""FedProto (Tan et al. 2022): the count-weighted server average and a client's prototypes by hand,
the loss context carrying the step's own penultimate features, the prototype term's value and
gradient, weight 0 against training alone, the bytes of a round, the vectorized executor against
the sequential one, and the refusals (a network without the feature split, different widths)."""

import math

import pytest
import torch
import torch.nn.functional as F

from fdlit.callbacks import FederationCallback
from fdlit.clients.loss_context import LossContext
from fdlit.errors import ConfigError
from fdlit.execution import VectorizedExecutor
from fdlit.methods import FedProto
from fdlit.methods.base import context_for
from fdlit.methods.contexts import ClientContext, FederationInfo
from fdlit.methods.fedavg import flatten
from fdlit.methods.fedproto import FedProtoClient
from tests.fitting import MLP16
from tests.fitting import data_free_loop as loop_for

C, D = 10, 16


def params(loop, i=0):
    return flatten(list(loop.view.clients[i].model.parameters()))


def mlp_hidden(model, x):
    """The digits MLP's penultimate features, written out: ReLU(W1 x + b1) (dropout 0)."""
    first = model.net[1]
    return torch.relu(x.flatten(1) @ first.weight.T + first.bias)


# ---------------------------------------------------------------- by hand
def test_server_averages_prototypes_weighted_by_class_counts():
    g = torch.Generator().manual_seed(0)
    protos = [torch.randn(C, 4, generator=g) for _ in range(2)]
    counts = [torch.tensor([3, 0] + [0] * 8, dtype=torch.int32), torch.tensor([1, 5] + [0] * 8, dtype=torch.int32)]
    uploads = [{"prototypes": p, "class_counts": n} for p, n in zip(protos, counts, strict=True)]
    out = FedProto().aggregate(uploads, context_for([{"logits": torch.zeros(0, C)}] * 2)).broadcast
    torch.testing.assert_close(out["global_prototypes"][0], (3 * protos[0][0] + protos[1][0]) / 4)
    torch.testing.assert_close(out["global_prototypes"][1], protos[1][1])
    assert out["class_mask"].tolist() == [True, True] + [False] * 8
    assert not out["global_prototypes"][2:].any()
    # weighting: mean (the authors' proto_aggregation, PFLlib): the plain mean over the class's holders
    plain = FedProto(weighting="mean").aggregate(uploads, context_for([{"logits": torch.zeros(0, C)}] * 2)).broadcast
    torch.testing.assert_close(plain["global_prototypes"][0], (protos[0][0] + protos[1][0]) / 2)
    torch.testing.assert_close(plain["global_prototypes"][1], protos[1][1])  # client 0 does not hold class 1
    assert plain["class_mask"].tolist() == out["class_mask"].tolist()
    with pytest.raises(ConfigError, match=r"^aggregator.weighting: allowed: counts, mean; got 'median'$"):
        FedProto(weighting="median")


def test_a_clients_prototypes_are_its_mean_penultimate_features_per_class():
    loop = loop_for(FedProto(), rounds=1)
    loop.fit()
    client, data = loop.view.clients[0], loop.view.client_data[0]
    info = FederationInfo(round=1, seed=0, num_clients=4, num_classes=C, public_x=torch.zeros(0, 1))
    sent = loop.parts.clients.method_part.upload(ClientContext(info, client, data, None, {}, client.method_state))
    with torch.no_grad():
        hidden = mlp_hidden(client.model, data.train.x)
    assert sent["prototypes"].shape == (C, D) and sent["prototypes"].dtype == torch.float32
    for c in range(C):
        rows = data.train.y == c
        assert int(sent["class_counts"][c]) == int(rows.sum())
        if rows.any():
            torch.testing.assert_close(sent["prototypes"][c], hidden[rows].mean(0))
        else:
            assert not sent["prototypes"][c].any()
    assert int((sent["class_counts"] > 0).sum()) == len(client.classes)


class Probe(FedProtoClient):
    """FedProto's part that keeps what its loss was given."""

    def loss(self, ctx):
        self.seen = (ctx.features, ctx.logits)
        return super().loss(ctx)


def test_the_loss_context_carries_the_features_of_the_steps_own_forward():
    loop = loop_for(FedProto(), rounds=1)
    loop.fit()
    client = loop.view.clients[0]
    probe = Probe(1.0)
    client.method_part = probe
    x, y = loop.view.client_data[0].train.x[:8], loop.view.client_data[0].train.y[:8]
    client.train()
    loss = client.training_step((x, y))
    features, logits = probe.seen
    torch.testing.assert_close(features, mlp_hidden(client.model, x))
    torch.testing.assert_close(logits, client.model(x))
    assert features.requires_grad and loss.requires_grad  # the term trains the feature extractor


def test_the_prototype_term_is_its_formula_and_its_gradient_pulls_features_to_the_prototype():
    lam, b, d = 0.5, 6, 4
    g = torch.Generator().manual_seed(1)
    protos, logits = torch.randn(C, d, generator=g), torch.randn(b, C, generator=g)
    known = torch.ones(C)
    known[3] = 0.0  # a class no client holds: no pull
    y = torch.tensor([0, 1, 3, 1, 2, 3])
    features = torch.randn(b, d, generator=g, requires_grad=True)
    base = F.cross_entropy(logits, y)
    state = {"proto_global": protos, "proto_known": known}
    part = FedProto(lam=lam).client_part()
    loss = part.loss(LossContext(None, "private", logits, y, base, state, features=features))
    diff = features.detach() - protos[y]
    expected = base + lam * (known[y] * diff.pow(2).sum(-1) / d).mean()
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss, features)
    torch.testing.assert_close(grad, lam * 2 * known[y][:, None] * diff / (d * b))
    stepped = features.detach() - 0.1 * grad
    before, after = diff.norm(dim=-1), (stepped - protos[y]).norm(dim=-1)
    held = known[y] > 0
    assert (after[held] < before[held]).all() and torch.equal(after[~held], before[~held])
    # no term in the public phase, nor before the first prototypes arrive
    assert part.loss(LossContext(None, "public", logits, y, base, state, features=features)) is base
    assert part.loss(LossContext(None, "private", logits, y, base, {}, features=features)) is base


# ---------------------------------------------------------------- whole runs
class OwnPrototypes(FederationCallback):
    """After round 1, client 0's mean penultimate features per class on its training split, computed
    here; ``give``: hand them to the client as FedProto's global prototypes."""

    def __init__(self, give: bool):
        self.give, self.seen = give, {}

    def on_round_end(self, loop, round, metrics):
        if round != 1:
            return
        client, train = loop.clients[0], loop.client_data[0].train
        with torch.no_grad():
            client.eval()
            hidden = mlp_hidden(client.model, train.x)
            client.train()
        own = torch.stack([hidden[train.y == c].mean(0) for c in range(C)])  # one client: every class
        self.seen = {"own": own, "state": dict(client.method_state)}
        if self.give:
            client.method_state.update(proto_global=own, proto_known=torch.ones(C))


def test_one_client_trains_as_alone_with_its_own_prototypes_as_the_global_ones():
    """One client: the count-weighted average is its own prototypes, so round 2 trains exactly as the
    client trained alone (nothing sent) with its own prototypes given as the global ones."""
    watch = OwnPrototypes(give=False)
    fed = loop_for(FedProto(lam=2.0), clients=1, callbacks=[watch])
    fed.fit()
    torch.testing.assert_close(watch.seen["state"]["proto_global"], watch.seen["own"])
    give = OwnPrototypes(give=True)
    alone = loop_for(FedProto(lam=2.0), clients=1, mode="local_only", callbacks=[give])
    alone.fit()
    assert alone.server_side.ledger.messages == []
    torch.testing.assert_close(params(fed), params(alone), rtol=0, atol=1e-6)
    plain = loop_for(FedProto(lam=2.0), clients=1, mode="local_only")
    plain.fit()
    assert not torch.allclose(params(fed), params(plain), atol=1e-4)  # the term changed round 2's training


def test_weight_zero_is_training_alone_exactly_and_a_positive_weight_is_not():
    alone = loop_for(FedProto(0.0), mode="local_only")
    alone.fit()
    assert alone.server_side.ledger.messages == []
    off = loop_for(FedProto(0.0))
    off.fit()
    assert "proto_global" in off.view.clients[0].method_state  # the prototypes arrived, weighted by 0
    for i in range(4):
        assert torch.equal(params(off, i), params(alone, i))
    on = loop_for(FedProto(1.0))
    on.fit()
    assert not torch.equal(params(on), params(alone))  # the term changed round 2's training


def test_bytes_of_a_round_are_the_analytic_sizes():
    m, mask = 4, math.ceil(C / 8)
    loop = loop_for(FedProto())
    loop.fit()
    ledger = loop.server_side.ledger
    for r in (1, 2):
        assert ledger.total("up", round=r) == m * (C * D * 4 + C * 4)  # float32 prototypes, int32 counts
        assert ledger.total("down", round=r) == m * (C * D * 4 + mask)
    assert ledger.total(round=0) == 0
    assert {x.kind for x in ledger.messages} == {"prototypes", "class_counts", "global_prototypes", "class_mask"}


def test_two_networks_with_the_same_feature_width_exchange_prototypes():
    spec = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [D]}, "fraction": 0.5},
        {"class_path": "fdlit.models.SmallCNN", "init_args": {"hidden": D}, "fraction": 0.5}]}}
    loop = loop_for(FedProto(), model=spec)
    loop.fit()
    assert {type(c.model).__name__ for c in loop.view.clients} == {"MLP", "SmallCNN"} and loop.round == 2
    assert all(c.method_state["proto_global"].shape == (C, D) for c in loop.view.clients)


# ---------------------------------------------------------------- refusals
def test_refuses_clients_whose_feature_widths_differ():
    spec = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}, "fraction": 0.5},
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}, "fraction": 0.5}]}}
    with pytest.raises(ConfigError, match=r"^model: FedProto averages .* got widths \[16, 32\]$"):
        loop_for(FedProto(), model=spec, rounds=1).fit()


def test_different_widths_are_refused_in_one_line_before_any_training(tmp_path, capsys):
    from fdlit.cli import main

    groups = ('[{"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}, "fraction": 0.5}, '
              '{"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}, "fraction": 0.5}]')
    argv = ["fit", "--config", "digits_fedproto.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--data.num_clients", "4", "--data.classes_per_client", "3",
            "--data.public_size", "0", "--model", "fdlit.models.PerClient", "--model.groups", groups]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: model: FedProto averages"), err
    assert err[0].endswith("got widths [16, 32]")
    assert not [p for p in tmp_path.rglob("metrics.jsonl") if p.read_text().strip()]  # no round ran


class NoSplit(torch.nn.Module):
    """A network with only a forward: no ``embed`` / ``classify``."""

    def __init__(self, input_shape=None, num_classes=None):
        super().__init__()
        self.fc = torch.nn.Linear(math.prod(input_shape or (1, 8, 8)), num_classes or 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


def test_refuses_a_network_without_the_feature_split_before_training():
    loop = loop_for(FedProto(), model={"class_path": f"{__name__}.NoSplit"}, rounds=1)
    with pytest.raises(ConfigError) as err:
        loop.fit()
    message = str(err.value)
    assert message.startswith("model: FedProto reads") and "embed(x)" in message and "classify(" in message
    assert "NoSplit" in message and "\n" not in message
    assert loop.history == []


@pytest.mark.parametrize("model", [MLP16, {"class_path": "fdlit.models.SmallCNN", "init_args": {"hidden": D}}],
                         ids=["mlp", "cnn"])
def test_vectorized_executor_trains_as_the_sequential_one(model):
    # SGD for the CNN: Adam widens the grouped convolution's rounding (docs/vectorized-executor.md)
    optimizer = "adam" if model is MLP16 else "sgd"
    seq = loop_for(FedProto(), rounds=3, model=model, optimizer=optimizer)
    seq.fit()
    vec = loop_for(FedProto(), rounds=3, model=model, executor=VectorizedExecutor(), optimizer=optimizer)
    vec.fit()
    assert len(vec.parts.clients.executor._vectorized) == 4  # stacked, not through the sequential fallback
    for i in range(4):
        torch.testing.assert_close(params(vec, i), params(seq, i), rtol=1e-4, atol=1e-5)
    off = loop_for(FedProto(0.0), rounds=3, model=model, executor=VectorizedExecutor(), optimizer=optimizer)
    off.fit()
    assert not torch.allclose(params(vec), params(off), atol=1e-4)  # the term is active under vmap
