"""F2L as published (Nguyen et al. 2022): regional FedAvg, the global server's label-driven
distillation with Eq. 9's joint loss, the switch back to FedAvg, and what each tier sends."""

import pytest
import torch
from sklearn.metrics import roc_auc_score

from fdlit.errors import ConfigError
from fdlit.methods import F2L, F2LParams
from fdlit.methods.base import FederationInfo, ServerContext, context_for
from fdlit.methods.f2l_fedavg import class_auc
from fdlit.methods.fedavg import exchanged_tensors, flatten
from tests.fitting import exchange_loop as loop_for


def test_coefficients_follow_eq_11_and_12():
    lam1, lam2, lam3 = F2LParams(regions=3, hard_weight=0.01).coefficients(3)
    assert lam3 == 0.01 and lam2 == pytest.approx(lam1 / 3) and lam1 + lam2 + lam3 == pytest.approx(1.0)
    assert F2LParams(hard_weight=0.2, update_distillation=False).coefficients(3) == (pytest.approx(0.8), 0.0, 0.2)


def test_class_auc_is_sklearns_one_vs_rest_auc():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (200,), generator=g)
    scores = torch.randn(200, 5, generator=g) + torch.nn.functional.one_hot(y, 5)
    auc = class_auc(scores, y, 5)  # class 4 has no positives: no evidence
    for c in range(4):
        assert float(auc[c]) == pytest.approx(roc_auc_score((y == c).numpy(), scores[:, c].numpy()), abs=1e-12)
    assert float(auc[4]) == 0.5


def fitted(method, rounds=2, **kw):
    loop = loop_for(method, rounds=rounds, clients=4, **kw)
    loop.fit()
    return loop


def test_between_global_rounds_each_region_holds_its_own_fedavg_and_pays_for_one_model():
    """Round 1 is regional (global_every 2): clients of a region share the n_k-weighted average of
    its members; the two regions differ; every client is charged P floats down, not R x P."""
    method = F2LParams(regions=[0, 1, 0, 1], global_every=2)
    loop = fitted(method, rounds=1)
    held = [flatten(exchanged_tensors(c.model)) for c in loop.view.clients]
    assert torch.equal(held[0], held[2]) and torch.equal(held[1], held[3])
    assert not torch.allclose(held[0], held[1])
    torch.testing.assert_close(method.regional[0], held[0])
    p = held[0].numel()
    for i in range(4):
        assert loop.server_side.ledger.total("down", round=1, client=i) == p * 4
    stats = loop.history[-1]
    assert stats["f2l/bytes_region_to_global"] == 0 and stats["f2l/bytes_client_to_region"] == 4 * p * 4


def test_a_global_round_gives_every_client_the_global_model_and_counts_both_tiers():
    method = F2LParams(regions=2, global_every=2, epochs=1)
    loop = fitted(method, rounds=2)
    held = [flatten(exchanged_tensors(c.model)) for c in loop.view.clients]
    assert all(torch.equal(h, held[0]) for h in held)
    torch.testing.assert_close(method.global_model, held[0])
    p = held[0].numel()
    stats = loop.history[-1]
    assert stats["f2l/bytes_region_to_global"] == stats["f2l/bytes_global_to_region"] == 2 * p * 4
    assert stats["f2l/lkd_active"] in (0.0, 1.0) and "f2l/beta_gap" in stats
    assert loop.server_side.ledger.total("down", round=2, client=0) == p * 4


def regional_setup(num_regions=2, seed=0, same=False):
    """A server-side F2LParams after set-up, with R regional models of a small MLP on 40 samples."""
    loop = loop_for(F2LParams(regions=num_regions, global_every=1, epochs=2, lr=0.01), rounds=1, clients=4)
    loop.setup()
    loop.protocol.method_setup(loop.parts)
    method = loop.server_side.method
    torch.manual_seed(seed)
    models = [flatten(exchanged_tensors(c.model)) for c in loop.view.clients[:num_regions]]
    if same:
        models = [models[0]] * num_regions
    return loop, method, models


def aggregate(loop, method, models, round=1):
    uploads = [{"parameters": models[i % len(models)].clone()} for i in range(4)]
    method.regions = type(method.regions)(tuple(i % len(models) for i in range(4)))
    info = FederationInfo(round=round, seed=0, num_clients=4, num_classes=10, public_x=loop.parts.tensors.public_x)
    return method.aggregate(uploads, ServerContext(info, loop.parts.tensors.public_y))


def test_regions_that_agree_are_averaged_without_distillation():
    loop, method, models = regional_setup(same=True)
    method.epsilon = 0.1
    result = aggregate(loop, method, models)
    assert result.stats["f2l/beta_gap"] == 0.0 and result.stats["f2l/lkd_active"] == 0.0
    torch.testing.assert_close(result.broadcast["parameters"], models[0])


def test_regions_that_disagree_are_distilled_from_the_old_global_model():
    loop, method, models = regional_setup()
    method.epsilon = 0.0  # F2L-noFedAvg: always LKD
    old = method.global_model.clone()
    result = aggregate(loop, method, models)
    assert result.stats["f2l/lkd_active"] == 1.0 and result.stats["f2l/distill_loss"] > 0
    new = result.broadcast["parameters"]
    assert not torch.allclose(new, torch.stack(models).mean(0)) and not torch.allclose(new, old)
    method.epsilon = 2.0  # a beta gap is at most 1: always FedAvg across regions
    torch.testing.assert_close(aggregate(loop, method, models).broadcast["parameters"], torch.stack(models).mean(0))


def test_the_hard_loss_alone_trains_on_the_server_pools_labels():
    """lambda_3 = 1 (no soft terms): the global step is plain cross-entropy on S, so the distilled
    model fits the labelled pool better than the old global model did."""
    loop, method, models = regional_setup()
    method.epsilon, method.hard_weight, method.epochs = 0.0, 1.0, 20
    net = method._network(ServerContext(FederationInfo(1, 0, 4, 10, loop.parts.tensors.public_x), loop.parts.tensors.public_y), models[0])
    before = (method._logits(net, loop.parts.tensors.public_x, method.global_model).argmax(-1) == loop.parts.tensors.public_y).float().mean()
    new = aggregate(loop, method, models).broadcast["parameters"]
    after = (method._logits(net, loop.parts.tensors.public_x, new).argmax(-1) == loop.parts.tensors.public_y).float().mean()
    assert after > before + 0.3


def test_a_reliable_region_is_followed_on_its_classes():
    """One region's model is the old global model trained with CE on S (reliable on every class),
    the other is random: the distilled model agrees with the reliable one far more often."""
    loop, method, models = regional_setup()
    method.epsilon, method.hard_weight, method.epochs = 0.0, 1.0, 30
    good = aggregate(loop, method, models).broadcast["parameters"]  # CE-trained on S
    method.load_state_dict({**method.state_dict(), "global_model": models[1].clone()})
    method.hard_weight, method.update_distillation, method.epochs = 0.0, False, 10
    new = aggregate(loop, method, [good, models[1]]).broadcast["parameters"]
    net = method.net
    pred = {k: method._logits(net, loop.parts.tensors.public_x, w).argmax(-1) for k, w in
            {"good": good, "random": models[1], "new": new}.items()}
    assert (pred["new"] == pred["good"]).float().mean() > (pred["new"] == pred["random"]).float().mean() + 0.3


@pytest.mark.parametrize("kwargs", [{"regions": 0}, {"global_every": 0}, {"epsilon": -0.1},
                                    {"hard_weight": 1.5}, {"optimizer": "rmsprop"}, {"server_labelled_size": 1}])
def test_bad_settings_name_their_field(kwargs):
    with pytest.raises(ConfigError, match=r"aggregator\.(regions|global_every|epsilon|hard_weight|optimizer|server)"):
        F2LParams(**kwargs)


def test_fd_f2l_switches_to_the_size_weighted_mean_once_regions_agree():
    g = torch.Generator().manual_seed(0)
    up = [{"logits": 3 * torch.randn(30, 4, generator=g), "class_auc": torch.rand(4, generator=g)} for _ in range(6)]
    lkd = F2L(regions=3).aggregate(up, context_for(up))
    switched = F2L(regions=3, epsilon=2.0).aggregate(up, context_for(up))
    avg = F2L(regions=3, across="avg").aggregate(up, context_for(up))
    assert lkd.stats["f2l/lkd_active"] == 1.0 and switched.stats["f2l/lkd_active"] == 0.0
    torch.testing.assert_close(switched.teacher, avg.teacher)
    assert not torch.allclose(lkd.teacher, avg.teacher, atol=1e-3)
    assert 0 < lkd.stats["f2l/beta_gap"] <= 1
