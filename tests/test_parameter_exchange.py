"""Parameter exchange (FedAvg, FedProx, SCAFFOLD) on tiny digits federations: equivalences, bytes,
the control variates by hand, and what is refused before any work."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fdlit.clients import ClientOptimization
from fdlit.errors import ConfigError
from fdlit.execution import VectorizedExecutor
from fdlit.federation import FederationLoop
from fdlit.methods import FedAvg, FedProx, Scaffold
from fdlit.methods.fedavg import flatten
from fdlit.methods.fedprox import FedProxClient
from tests.fitting import MLP16
from tests.fitting import exchange_loop as loop_for


def params(loop, i=0):
    return flatten(list(loop.view.clients[i].model.parameters()))


def test_fedavg_with_one_client_equals_the_client_trained_alone():
    """R rounds of FedAvg x 1 epoch with one client = that client trained R epochs alone (same data
    order). Adam: its moments persist across the exchange, as they do in one run."""
    optimizer = "adam"
    fed = loop_for(FedAvg(), rounds=3, clients=1, optimizer=optimizer)
    fed.fit()
    alone = loop_for(FedAvg(), rounds=1, clients=1, optimizer=optimizer, epochs=3, mode="local_only")
    alone.fit()
    assert fed.server_side.ledger.total("up", round=3) > 0 and alone.server_side.ledger.messages == []
    assert torch.equal(params(fed), params(alone))


def test_bytes_fedavg_two_p_floats_per_client_per_round_scaffold_twice_that():
    fedavg, scaffold = loop_for(FedAvg()), loop_for(Scaffold())
    fedavg.fit()
    scaffold.fit()
    p = sum(t.numel() for t in fedavg.view.clients[0].model.parameters())  # MLP: no buffers
    assert p == 64 * 16 + 16 + 16 * 10 + 10
    for i in range(4):
        assert fedavg.server_side.ledger.total("down", round=0, client=i) == p * 4  # the initial model
        # n_i (one int64); client 0 also sends the initial model the server starts from
        assert fedavg.server_side.ledger.total("up", round=0, client=i) == 8 + (p * 4 if i == 0 else 0)
        for r in (1, 2):
            assert fedavg.server_side.ledger.total(round=r, client=i) == 2 * p * 4
            assert fedavg.server_side.ledger.total("up", round=r, client=i) == p * 4
            assert scaffold.server_side.ledger.total(round=r, client=i) == 2 * 2 * p * 4
    kinds = {m.kind for m in scaffold.server_side.ledger.messages if m.round > 0}
    assert kinds == {"parameters", "control_delta", "control"}


def test_after_the_exchange_every_client_holds_the_weighted_average():
    loop = loop_for(FedAvg(), rounds=1)
    uploads = []

    class Spy(FedAvg):
        def aggregate(self, ups, ctx=None):
            uploads.extend(u["parameters"].clone() for u in ups)
            return super().aggregate(ups, ctx)

    loop.server_side.method = Spy()
    loop.fit()
    n = torch.tensor([len(cd.train.y) for cd in loop.data.clients], dtype=torch.float64)
    expected = sum(w * u.double() for w, u in zip(n / n.sum(), uploads, strict=True)).float()
    assert not torch.equal(uploads[0], uploads[1])
    for i in range(4):
        torch.testing.assert_close(params(loop, i), expected)
    assert loop.history[-1]["after_public/global_acc_min"] == loop.history[-1]["after_public/global_acc_max"]


def test_fedprox_mu_zero_is_fedavg_exactly_and_mu_pulls_clients_to_the_global_model():
    fedavg, prox0 = loop_for(FedAvg()), loop_for(FedProx(mu=0.0))
    fedavg.fit()
    prox0.fit()
    assert torch.equal(params(fedavg), params(prox0))

    drift = {}
    for mu in (0.0, 5.0):
        class DriftClient(FedProxClient):
            def upload(self, ctx):  # ||y_i - w_t|| after the private phase
                drift.setdefault(self.mu, []).append(float((flatten(list(ctx.client.model.parameters()))
                                                            - ctx.state["prox_center"]).norm()))
                return super().upload(ctx)

        class Drift(FedProx):
            def client_part(self):
                return DriftClient(self.mu)
        loop_for(Drift(mu=mu), epochs=2).fit()
    assert max(drift[5.0]) < min(drift[0.0])


@pytest.mark.parametrize("method", [lambda: FedProx(mu=0.5), Scaffold])
def test_vectorized_executor_reads_each_clients_own_loss_state(method):
    """SCAFFOLD's correction c - c_i differs per client: under vmap every client must see its own."""
    seq, vec = loop_for(method()), loop_for(method(), executor=VectorizedExecutor(strict=True))
    seq.fit()
    vec.fit()
    if isinstance(seq.server_side.method, Scaffold):
        first, second = seq.view.clients[:2]
        assert not torch.equal(first.method_state["linear_term"], second.method_state["linear_term"])
    for i in range(4):
        torch.testing.assert_close(params(vec, i), params(seq, i), rtol=1e-5, atol=1e-6)


def test_scaffold_server_control_is_the_mean_of_the_client_controls():
    loop = loop_for(Scaffold(), rounds=3)
    loop.fit()
    c_i = torch.stack([c.method_state["scaffold_c_i"] for c in loop.view.clients])
    assert c_i.abs().sum() > 0 and not torch.allclose(c_i[0], c_i[1])
    torch.testing.assert_close(loop.server_side.method.control, c_i.mean(0))
    for c in loop.view.clients:
        torch.testing.assert_close(c.method_state["scaffold_c"], loop.server_side.method.control)


def test_scaffold_two_rounds_of_one_full_batch_step_by_hand():
    """K = 1 (one full batch): c_i after round 1 is client i's gradient at x0; round 2 steps with
    g_i(x1) + c - c_i. Both rounds recomputed with autograd and compared with the run."""
    lr = 0.1
    loop = loop_for(Scaffold(), rounds=2, clients=2, lr=lr, batch_size=10_000)
    loop.setup()
    model = loop.view.clients[0].model
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    x0 = params(loop, 0).clone()
    data = [(cd.train.x, cd.train.y) for cd in loop.data.clients]
    n = torch.tensor([float(len(y)) for _, y in data])
    w = n / n.sum()

    def grad(flat, x, y):
        flat = flat.clone().requires_grad_(True)
        tensors = torch.split(flat, [s.numel() for s in shapes])
        named = {k: t.view(s) for k, t, s in zip(names, tensors, shapes, strict=True)}
        F.cross_entropy(functional_call(model, named, (x,)), y).backward()
        return flat.grad

    g0 = [grad(x0, x, y) for x, y in data]
    x1 = sum(wi * (x0 - lr * g) for wi, g in zip(w, g0, strict=True))
    c1 = sum(g0) / 2  # c_i = (x0 - y_i) / (1 * lr) = g_i(x0)
    y2 = [x1 - lr * (grad(x1, x, y) + c1 - g) for (x, y), g in zip(data, g0, strict=True)]
    x2 = sum(wi * y for wi, y in zip(w, y2, strict=True))

    loop.fit()
    torch.testing.assert_close(params(loop, 0), x2, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(loop.view.clients[0].method_state["scaffold_c_i"] - g0[0],
                               (x1 - y2[0]) / lr - c1, rtol=1e-4, atol=1e-5)  # round 2's option II update


def test_heterogeneous_models_and_non_sgd_scaffold_are_refused_before_any_work():
    hetero = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}, "fraction": 0.5},
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}}]}}
    for method in (FedAvg(), FedProx(), Scaffold()):
        with pytest.raises(ConfigError, match="same architecture") as err:
            FederationLoop(model=hetero, aggregator=method, client=ClientOptimization(optimizer="sgd"))
        assert err.value.field == "model.class_path"
    with pytest.raises(ConfigError, match="allowed: 'sgd'") as err:
        FederationLoop(model=MLP16, aggregator=Scaffold(), client=ClientOptimization(optimizer="adam"))
    assert err.value.field == "client.optimizer"
    with pytest.raises(ConfigError) as err:
        FederationLoop(model=MLP16, aggregator=Scaffold(), client=ClientOptimization(optimizer="sgd", momentum=0.9))
    assert err.value.field == "client.momentum"
    with pytest.raises(ConfigError) as err:
        FedProx(mu=-1.0)
    assert err.value.field == "aggregator.mu"


def test_a_rule_with_client_hooks_on_the_aggregator_is_refused_in_one_line_not_silently_skipped():
    """The framework calls the client part's hooks only: a rule that defines ``client_upload`` on the
    Aggregator would upload without it, so it is refused before anything trains, naming the hook."""
    arrived = []

    class OldStyle(FedAvg):
        def client_upload(self, ctx):
            return {"client_norm": flatten(list(ctx.client.model.parameters())).norm()}

        def aggregate(self, uploads, ctx):
            arrived.append(sorted(uploads[0]))
            return super().aggregate(uploads, ctx)

    with pytest.raises(ConfigError) as err:
        loop_for(OldStyle()).fit()
    assert err.value.field == "aggregator"
    assert "OldStyle defines client_upload on the Aggregator; define them on its ClientPart (client_upload as " \
           "upload)" in str(err.value)
    assert arrived == []
