"""FML (Shen et al. 2020): the pair network (the evaluated network's logits as the client's output,
both networks' logits to the loss), the loss against its formula by hand and its gradients (each
network descends its own loss), one client's average is its own meme network, the bytes of a
round, the vectorized executor against the sequential one, heterogeneous private networks, and
the refusals (bad weights, different shared networks)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fdlit.cli import main
from fdlit.clients.loss_context import LossContext
from fdlit.errors import ConfigError
from fdlit.execution import VectorizedExecutor
from fdlit.methods import FML
from fdlit.methods.base import context_for
from fdlit.methods.parameters import flatten
from fdlit.models.mutual import MutualPair, find_pair
from tests.fitting import MLP16, pair_spec, private, shared
from tests.fitting import data_free_loop as loop_for

C = 10
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


# ---------------------------------------------------------------- the pair
@pytest.mark.parametrize("evaluate", ["shared", "private"])
def test_a_plain_network_is_paired_with_a_fresh_copy_whose_forward_is_the_evaluated_network(evaluate):
    loop = loop_for(FML(evaluate=evaluate), rounds=1)
    loop.fit()
    pair = find_pair(loop.view.clients[0].model)
    assert isinstance(pair, MutualPair) and type(pair.private) is type(pair.shared)
    assert not torch.equal(flatten(list(pair.private.parameters())), flatten(list(pair.shared.parameters())))
    x = loop.view.client_data[0].train.x[:5]
    with torch.no_grad():
        torch.testing.assert_close(loop.view.clients[0](x), getattr(pair, evaluate)(x), rtol=0, atol=0)
        both = pair.embed(x)
        torch.testing.assert_close(both, torch.cat([pair.private(x), pair.shared(x)], -1), rtol=0, atol=0)
        torch.testing.assert_close(pair.classify(both), pair.private(x), rtol=0, atol=0)


def test_which_network_is_evaluated_changes_the_accuracies_not_the_training():
    shared, private = loop_for(FML(evaluate="shared"), rounds=2), loop_for(FML(), rounds=2)
    shared.fit()
    private.fit()
    for a, b in zip(shared.view.clients, private.view.clients, strict=True):
        assert torch.equal(flatten(list(a.model.parameters())), flatten(list(b.model.parameters())))
    x, y = shared.parts.tensors.test_x, shared.parts.tensors.test_y
    for loop, name in ((shared, "shared"), (private, "private")):
        with torch.no_grad():
            hand = torch.stack([(getattr(find_pair(c.model), name)(x).argmax(-1) == y).float().mean()
                                for c in loop.view.clients]).mean()
        assert loop.history[-1]["after_public/global_acc_mean"] == pytest.approx(float(hand), abs=1e-6)
    with pytest.raises(ConfigError, match="aggregator.evaluate"):
        FML(evaluate="meme")


def test_after_a_round_every_client_holds_the_same_meme_network_and_its_own_private_one():
    loop = loop_for(FML(), rounds=1)
    loop.fit()
    for i in range(1, 4):
        assert torch.equal(shared(loop, i), shared(loop, 0))
        assert not torch.equal(private(loop, i), private(loop, 0))


# ---------------------------------------------------------------- the loss by hand
def test_the_loss_is_its_formula_and_each_network_descends_its_own_loss():
    alpha, beta, b = 0.3, 0.8, 5
    g = torch.Generator().manual_seed(3)
    local = torch.randn(b, C, generator=g, requires_grad=True)
    meme = torch.randn(b, C, generator=g, requires_grad=True)
    y = torch.tensor([0, 4, 4, 9, 2])
    part = FML(alpha, beta).client_part()
    both = torch.cat([local, meme], -1)
    loss = part.loss(LossContext(None, "private", local, y, F.cross_entropy(local, y), {}, features=both))

    def ce(z):  # -log softmax(z)[y], written out
        return -(z.gather(1, y[:, None])[:, 0] - z.exp().sum(1).log())

    def kl(p_logits, q_logits):  # KL(p || q) = sum p log(p / q), written out
        p, q = p_logits.softmax(1), q_logits.softmax(1)
        return (p * (p / q).log()).sum(1)

    l_local = alpha * ce(local) + (1 - alpha) * kl(meme, local)
    l_meme = beta * ce(meme) + (1 - beta) * kl(local, meme)
    torch.testing.assert_close(loss, (l_local + l_meme).mean())
    g_local, g_meme = torch.autograd.grad(loss, (local, meme))
    own_local = torch.autograd.grad((alpha * ce(local) + (1 - alpha) * kl(meme.detach(), local)).mean(), local)[0]
    own_meme = torch.autograd.grad((beta * ce(meme) + (1 - beta) * kl(local.detach(), meme)).mean(), meme)[0]
    torch.testing.assert_close(g_local, own_local)
    torch.testing.assert_close(g_meme, own_meme)
    base = F.cross_entropy(local, y)
    assert part.loss(LossContext(None, "public", local, y, base, {}, features=both)) is base


def test_a_padded_batch_gives_the_loss_of_its_real_rows():
    g = torch.Generator().manual_seed(4)
    both, y = torch.randn(6, 2 * C, generator=g), torch.tensor([1, 2, 3, 4, 0, 0])
    part = FML(0.4, 0.6).client_part()
    real = part.loss(LossContext(None, "private", both[:4, :C], y[:4], torch.tensor(0.0), {}, features=both[:4]))
    weight = torch.tensor([1.0, 1, 1, 1, 0, 0])
    padded = part.loss(LossContext(None, "private", both[:, :C], y, torch.tensor(0.0), {}, weight, both))
    torch.testing.assert_close(padded, real)


def test_without_distillation_the_private_networks_train_as_if_alone():
    """alpha = beta = 1 leaves only the two cross-entropies: the private network's training does not
    depend on the meme network, so it is the same exchanging or not; alpha < 1 is not."""
    fed, alone = loop_for(FML(1.0, 1.0)), loop_for(FML(1.0, 1.0), mode="local_only")
    fed.fit()
    alone.fit()
    assert alone.server_side.ledger.messages == []
    for i in range(4):
        assert torch.equal(private(fed, i), private(alone, i))
        assert not torch.equal(shared(fed, i), shared(alone, i))
    mutual = loop_for(FML(0.5, 1.0))
    mutual.fit()
    assert not torch.allclose(private(mutual), private(fed), atol=1e-4)


# ---------------------------------------------------------------- the server
def test_with_one_upload_the_average_is_that_clients_meme_network():
    method = FML()
    w = torch.randn(50, generator=torch.Generator().manual_seed(0))
    method.server_setup([{"num_samples": torch.tensor(37), "initial_parameters": w}], context_for([{}]))
    upload = torch.randn(50, generator=torch.Generator().manual_seed(1))
    out = method.aggregate([{"parameters": upload}], context_for([{}]))
    assert torch.equal(out.broadcast["parameters"], upload)


class Recording(FML):
    """FML that keeps what it aggregated."""

    def aggregate(self, uploads, ctx):
        out = super().aggregate(uploads, ctx)
        self.seen = [u["parameters"].clone() for u in uploads], out.broadcast["parameters"].clone()
        return out


def test_one_client_receives_back_exactly_its_own_meme_network():
    method = Recording()
    loop = loop_for(method, rounds=1, clients=1)
    loop.fit()
    (sent,), back = method.seen
    assert torch.equal(back, sent) and torch.equal(shared(loop), sent)


def test_bytes_of_a_round_are_the_meme_networks_size():
    loop = loop_for(FML())
    loop.fit()
    ledger = loop.server_side.ledger
    p = shared(loop).numel()
    assert p == sum(t.numel() for t in find_pair(loop.view.clients[0].model).shared.parameters())
    for r in (1, 2):
        assert ledger.total("up", round=r) == 4 * p * 4 and ledger.total("down", round=r) == 4 * p * 4
    assert ledger.total("up", round=0) == 4 * 8 + p * 4  # n_k from each, the initial model from client 0
    assert ledger.total("down", round=0) == 4 * p * 4
    assert {m.kind for m in ledger.messages} == {"num_samples", "initial_parameters", "parameters"}


# ---------------------------------------------------------------- executors
CNN = {"class_path": "fdlit.models.SmallCNN", "init_args": {"channels": 4, "hidden": 16}}


# the convolutional stack runs under vmap, whose float32 sums are ordered otherwise: Adam turns
# that rounding into 1e-4 steps where a gradient is ~0, so it is compared in float64 (1e-15 apart)
@pytest.mark.parametrize("model,precision,tol", [(MLP16, "32-true", 1e-5), (CNN, "64-true", 1e-12)],
                         ids=["mlp", "cnn-float64"])
def test_vectorized_executor_trains_as_the_sequential_one(model, precision, tol):
    seq = loop_for(FML(0.3, 0.7), model=model, precision=precision)
    seq.fit()
    vec = loop_for(FML(0.3, 0.7), model=model, precision=precision, executor=VectorizedExecutor())
    vec.fit()
    assert len(vec.parts.clients.executor._vectorized) == 4  # stacked, not through the sequential fallback
    for i in range(4):
        torch.testing.assert_close(private(vec, i), private(seq, i), rtol=10 * tol, atol=tol)
        torch.testing.assert_close(shared(vec, i), shared(seq, i), rtol=10 * tol, atol=tol)
    for a, b in zip(seq.history, vec.history, strict=True):
        assert a["after_private/global_acc_mean"] == pytest.approx(b["after_private/global_acc_mean"], abs=1e-6)


# ---------------------------------------------------------------- heterogeneous private networks
def per_client(*pairs):
    return {"class_path": "fdlit.models.PerClient",
            "init_args": {"groups": [{**p, "fraction": 0.5} for p in pairs]}}


def test_private_networks_may_differ_when_the_meme_network_is_the_same():
    cnn = {"class_path": "fdlit.models.SmallCNN", "init_args": {"channels": 4, "hidden": 16}}
    loop = loop_for(FML(), model=per_client(pair_spec(MLP16, MLP16), pair_spec(cnn, MLP16)))
    loop.fit()
    kinds = {type(find_pair(c.model).private).__name__ for c in loop.view.clients}
    assert kinds == {"MLP", "SmallCNN"} and loop.round == 2
    assert all(torch.equal(shared(loop, i), shared(loop, 0)) for i in range(4))


@pytest.mark.parametrize("model", [
    per_client(pair_spec(MLP16, MLP16), pair_spec(MLP16, {"class_path": "fdlit.models.MLP",
                                                          "init_args": {"hidden": [32]}})),
    per_client(MLP16, {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}}),
], ids=["two-shared-networks", "plain-networks-copied"])
def test_different_shared_networks_are_refused_naming_the_groups(model):
    with pytest.raises(ConfigError, match=r"^model\.init_args\.groups: FML averages the shared network") as err:
        loop_for(FML(), model=model)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("field,value", [("alpha", -0.1), ("alpha", 1.5), ("beta", 2.0), ("beta", float("nan"))])
def test_weights_outside_zero_one_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"^aggregator\.{field}: "):
        FML(**{field: value})


def test_the_command_line_refuses_a_bad_weight_before_any_work(tmp_path, capsys):
    code = main(["fit", "--config", str(CONFIGS / "digits_fml.yaml"), "--aggregator.init_args.beta", "1.2",
                 "--logger.mode", "disabled", "--logger.run_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fdlit: error: aggregator.beta") and "Traceback" not in err


def test_a_loss_given_other_features_than_both_networks_logits_is_refused():
    logits, hidden = torch.randn(3, C), torch.randn(3, 16)  # e.g. an unpaired MLP's penultimate features
    part = FML().client_part()
    with pytest.raises(ConfigError, match="^model: FML's loss needs both networks' logits"):
        part.loss(LossContext(None, "private", logits, torch.tensor([0, 1, 2]), torch.tensor(0.0), {}, features=hidden))
