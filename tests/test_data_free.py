"""Data-free federated distillation (FD): the server averages by hand, the loss terms by
hand, FD with one client against the client trained with its own per-class logits, the bytes of a
round, heterogeneous networks, the vectorized executor against the sequential one, and no public set."""

import math

import pytest
import torch
import torch.nn.functional as F

from fdlit.callbacks import FederationCallback
from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.data.federated import check_public_set
from fdlit.errors import ConfigError
from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.federation import FederationLoop
from fdlit.methods import FedAvg, FedDistill, SmoothedUncertaintyWeighted
from fdlit.methods.base import context_for
from fdlit.methods.fd import class_means
from fdlit.methods.fedavg import flatten

C = 10
MLP16 = {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}}


def loop_for(method, rounds=2, clients=4, model=MLP16, executor=None, public_size=0, epochs=1, **kw):
    return FederationLoop(
        rounds=rounds, private_epochs_first=epochs, private_epochs=epochs, public_epochs_first=0, public_epochs=0,
        data=FederatedData(num_clients=clients, classes_per_client={1: 10, 2: 5}.get(clients, 3),
                           public_size=public_size),
        model=model, client=ClientOptimization(optimizer="adam", lr=0.01, batch_size=32),
        aggregator=method, executor=executor or SequentialExecutor(), **kw,
    )


def params(loop, i=0):
    return flatten(list(loop.view.clients[i].model.parameters()))


def own_class_logits(view, i=0):
    """Client i's per-class average logits on its training split, computed here (``view``: the run's RoundView)."""
    train = view.client_data[i].train
    logits = view.clients[i].predict_logits(train.x)
    out = torch.zeros(C, C)
    for c in range(C):
        if (train.y == c).any():
            out[c] = logits[train.y == c].mean(0)
    return out


# ---------------------------------------------------------------- the server parts by hand
def test_fd_averages_each_class_over_the_clients_that_hold_it():
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(C, C, generator=g) for _ in range(3)]
    masks = [torch.zeros(C, dtype=torch.bool) for _ in range(3)]
    masks[0][[0, 1]] = True
    masks[1][[1, 2]] = True
    masks[2][[1]] = True  # class 1: all three; classes 3..9: nobody
    uploads = [{"class_logits": lg * m[:, None], "class_mask": m} for lg, m in zip(logits, masks, strict=True)]
    out = FedDistill().aggregate(uploads, context_for([{"logits": torch.zeros(0, C)}] * 3)).broadcast
    g_logits, held = out["global_class_logits"], out["class_mask"]
    torch.testing.assert_close(g_logits[0], logits[0][0])
    torch.testing.assert_close(g_logits[1], (logits[0][1] + logits[1][1] + logits[2][1]) / 3)
    torch.testing.assert_close(g_logits[2], logits[1][2])
    assert held.tolist() == [True, True, True] + [False] * 7
    assert torch.equal(g_logits[3:], torch.zeros(7, C))


def test_fd_with_one_upload_sends_back_exactly_its_own_logits():
    own = torch.randn(C, C)
    mask = torch.tensor([True, False] * 5)
    out = FedDistill().aggregate([{"class_logits": own * mask[:, None], "class_mask": mask}],
                         context_for([{"logits": torch.zeros(0, C)}])).broadcast
    assert torch.equal(out["global_class_logits"], own * mask[:, None])


def test_class_means_are_per_class_means():
    values, labels = torch.arange(12.0).reshape(6, 2), torch.tensor([0, 2, 0, 2, 2, 0])
    means, counts = class_means(values, labels, 4)
    assert counts.tolist() == [3, 0, 3, 0]
    torch.testing.assert_close(means[0], values[[0, 2, 5]].mean(0))
    torch.testing.assert_close(means[2], values[[1, 3, 4]].mean(0))
    assert torch.equal(means[1], torch.zeros(2))


# ---------------------------------------------------------------- the loss terms by hand
def test_fd_loss_is_ce_plus_gamma_t2_kl_to_the_global_logits_of_the_label():
    gamma, t = 0.7, 2.0
    part = FedDistill(gamma=gamma, temperature=t).client_part()
    teacher, known = torch.randn(C, C), torch.ones(C)
    known[3] = 0  # class 3: no holder, no term
    logits, y = torch.randn(5, C), torch.tensor([0, 3, 1, 1, 9])
    base = F.cross_entropy(logits, y)
    from fdlit.clients.loss_context import LossContext

    ctx = LossContext(None, "private", logits, y, base, {"fd_teacher": teacher, "fd_known": known})
    kl = F.kl_div(F.log_softmax(logits / t, -1), F.softmax(teacher[y] / t, -1), reduction="none").sum(-1)
    expected = base + gamma * t * t * (kl * known[y]).mean()
    torch.testing.assert_close(part.loss(ctx), expected)
    assert part.loss(LossContext(None, "private", logits, y, base, {})) is base  # round 1: no teacher yet


class OwnTeacher(FederationCallback):
    """After round 1, client 0's own per-class logits on its training split (its mean by class, as
    ``class_means`` takes it) and the class mask; ``give``: hand them to the client as FD's teacher."""

    def __init__(self, give: bool):
        self.give, self.seen = give, {}

    def on_round_end(self, loop, round, metrics):
        if round != 1:
            return
        train = loop.client_data[0].train
        own, counts = class_means(loop.clients[0].predict_logits(train.x), train.y, C)
        self.seen = {"own": own, "naive": own_class_logits(loop), "state": dict(loop.clients[0].method_state)}
        if self.give:
            loop.clients[0].method_state.update(fd_teacher=own, fd_known=(counts > 0).float())


def test_fd_with_one_client_equals_training_alone_with_its_own_class_logits_as_teacher():
    """One client: the server's per-class average is its own, so round 2 trains exactly as the client
    trained alone (local_only, nothing sent) with its own per-class logits given as the teacher."""
    watch = OwnTeacher(give=False)
    fed = loop_for(FedDistill(gamma=1.0, temperature=2.0), rounds=2, clients=1, callbacks=[watch])
    fed.fit()
    assert torch.equal(watch.seen["state"]["fd_teacher"], watch.seen["own"])  # what it received
    torch.testing.assert_close(watch.seen["own"], watch.seen["naive"])  # the mean by class, by hand
    give = OwnTeacher(give=True)
    alone = loop_for(FedDistill(gamma=1.0, temperature=2.0), rounds=2, clients=1, mode="local_only", callbacks=[give])
    alone.fit()
    assert alone.server_side.ledger.messages == []
    assert torch.equal(params(fed), params(alone))
    plain = loop_for(FedDistill(gamma=1.0, temperature=2.0), rounds=2, clients=1, mode="local_only")
    plain.fit()
    assert not torch.equal(params(fed), params(plain))  # the term changed round 2's training


@pytest.mark.parametrize("method", [FedDistill(gamma=0.0)], ids=["fd"])
def test_weight_zero_is_local_training_exactly(method):
    fed = loop_for(method)
    fed.fit()
    alone = loop_for(type(method)(0.0), mode="local_only")
    alone.fit()
    for i in range(4):
        assert torch.equal(params(fed, i), params(alone, i))


def test_bytes_of_a_round_are_the_analytic_sizes():
    m, mask = 4, math.ceil(C / 8)
    fd = loop_for(FedDistill())
    fd.fit()
    for r in (1, 2):
        assert fd.server_side.ledger.total("up", round=r) == m * (C * C * 4 + mask)
        assert fd.server_side.ledger.total("down", round=r) == m * (C * C * 4 + mask)
    assert fd.server_side.ledger.total(round=0) == 0
    assert {x.kind for x in fd.server_side.ledger.messages} == {"class_logits", "class_mask", "global_class_logits"}
    assert fd.history[-1]["comm/up_bytes"] == m * (C * C * 4 + mask)


@pytest.mark.parametrize("method", [FedDistill])
def test_vectorized_executor_trains_as_the_sequential_one(method):
    seq = loop_for(method(), rounds=3)
    seq.fit()
    vec = loop_for(method(), rounds=3, executor=VectorizedExecutor())
    vec.fit()
    for i in range(4):
        torch.testing.assert_close(params(vec, i), params(seq, i), rtol=1e-4, atol=1e-5)
    off = loop_for(method(0.0), rounds=3, executor=VectorizedExecutor())
    off.fit()
    assert not torch.allclose(params(vec), params(off), atol=1e-4)  # the term is active under vmap


HETERO = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
    {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [64]}, "fraction": 0.5},
    {"class_path": "fdlit.models.SmallCNN", "init_args": {"hidden": 64}, "fraction": 0.5}]}}


@pytest.mark.parametrize("method", [FedDistill])
def test_two_different_networks_exchange_without_parameters(method):
    loop = loop_for(method(), model=HETERO)
    loop.fit()
    kinds = {type(c.model).__name__ for c in loop.view.clients}
    assert kinds == {"MLP", "SmallCNN"} and loop.round == 2
    assert not any(m.kind == "parameters" for m in loop.server_side.ledger.messages)
    assert all(len(c.method_state) == 2 for c in loop.view.clients)


class ConvOnly(torch.nn.Module):
    """A network without a linear layer (1x1 convolution, then global average pooling)."""

    def __init__(self, input_shape=None, num_classes=None):
        super().__init__()
        self.conv = torch.nn.Conv2d((input_shape or (1, 8, 8))[0], num_classes or 10, 1)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


def test_no_public_set_every_non_test_sample_is_private():
    data = FederatedData(num_clients=4, classes_per_client=3, public_size=0).setup(0)
    assert len(data.public) == 0 and data.public.x.shape[1:] == data.test.x.shape[1:]
    assert len(data.pool) + len(data.test) == 1797


def test_public_size_zero_is_refused_for_methods_that_need_a_public_set():
    for method in (SmoothedUncertaintyWeighted(), FedAvg()):
        with pytest.raises(ConfigError) as err:
            check_public_set(0, method)
        assert str(err.value).startswith("data.public_size:") and "\n" not in str(err.value)
    check_public_set(0, FedDistill())
    check_public_set(0, SmoothedUncertaintyWeighted(), mode="local_only")
    check_public_set(1, SmoothedUncertaintyWeighted())
    with pytest.raises(ConfigError, match="data.public_size"):
        FederatedData(public_size=-1)


@pytest.mark.parametrize("method", [FedDistill])
def test_runs_without_a_public_set_and_with_one_alike(method):
    """The public set is not read: with 0 or 120 public samples the clients' private pools differ,
    so the runs differ, but both complete and send the same shapes."""
    none, some = loop_for(method(), public_size=0), loop_for(method(), public_size=120)
    none.fit()
    some.fit()
    assert none.round == some.round == 2
    sent = [[(m.kind, m.shape) for m in run.server_side.ledger.messages] for run in (none, some)]
    assert sent[0] == sent[1]
    assert math.isnan(none.history[-1]["teacher/acc"])

