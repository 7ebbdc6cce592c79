"""Selective-FD (Shao et al. 2024) as published: selectors on features (the client's penultimate layer,
refitted every round, or a frozen pretrained backbone), and a fresh public sample every round."""

import pytest
import torch

from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.federation import FederationLoop
from fdlit.methods import SelectiveFD
from fdlit.methods.base import ClientContext
from fdlit.methods.contexts import DistillationContext
from fdlit.methods.selective import penultimate_features


def tiny(aggregator, rounds=2):
    loop = FederationLoop(
        rounds=rounds, private_epochs_first=1, private_epochs=1, public_epochs_first=1, public_epochs=1,
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=120),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}}, aggregator=aggregator,
    )
    loop.setup()
    return loop


def context(loop, i, r=1):
    logits = loop.settings.executor.predict(loop.view.clients, loop.parts.tensors.public_x)
    client = loop.view.clients[i]
    return ClientContext(loop.parts.facts.info(r), client, loop.view.client_data[i], logits[i], {}, client.method_state)


def test_penultimate_features_are_the_input_of_the_last_linear_layer():
    loop = tiny(SelectiveFD(features="penultimate"))
    client = loop.view.clients[0]
    feats = penultimate_features(client, loop.parts.tensors.public_x)
    assert feats.shape == (len(loop.parts.tensors.public_x), 16)
    last = [m for m in client.model.modules() if isinstance(m, torch.nn.Linear)][-1]
    torch.testing.assert_close(last(feats.float()), client.predict_logits(loop.parts.tensors.public_x), atol=1e-5, rtol=1e-5)


def test_penultimate_selectors_are_fitted_on_the_current_features_every_round():
    agg = SelectiveFD(features="penultimate", per_class=False, auxiliary="public")
    loop = tiny(agg)
    part = agg.client_part()
    ctx = context(loop, 0)
    part.setup(ctx)
    assert "selective_mask" not in ctx.state  # nothing fitted once: the features will change
    up = part.upload(ctx)
    cd, client = loop.view.client_data[0], loop.view.clients[0]
    expected = part.client_mask(penultimate_features(client, cd.train.x), cd.train.y,
                               penultimate_features(client, cd.calibration.x), cd.calibration.y,
                               client.classes, penultimate_features(client, loop.parts.tensors.public_x),
                               seed=ctx.info.client_seed(0))
    assert torch.equal(up["mask"], expected)
    # training moves the features, so the next round's selectors see other points
    before = penultimate_features(loop.view.clients[0], loop.parts.tensors.public_x)
    loop.settings.executor.train(loop.view.clients, "private", loop.parts.tensors.private, 3, 32)
    assert not torch.allclose(before, penultimate_features(loop.view.clients[0], loop.parts.tensors.public_x))
    on_inputs = SelectiveFD(per_class=False, auxiliary="public").client_part()
    assert not torch.equal(expected, on_inputs.client_mask(cd.train.x, cd.train.y, cd.calibration.x, cd.calibration.y,
                                                           loop.view.clients[0].classes, loop.parts.tensors.public_x,
                                                           seed=ctx.info.client_seed(0)))


def test_each_round_uses_a_fresh_public_sample_shared_by_every_client_and_the_server():
    agg = SelectiveFD(client_selector=False, public_per_round=50, server_threshold=2.0)
    loop = tiny(agg)
    part = agg.client_part()
    s1, s2 = part.round_sample(loop.parts.facts.info(1)), part.round_sample(loop.parts.facts.info(2))
    assert int(s1.sum()) == int(s2.sum()) == 50 and not torch.equal(s1, s2)
    assert torch.equal(s1, part.round_sample(loop.parts.facts.info(1)))  # reproducible from (seed, round)
    uploads = []
    for i in range(len(loop.view.clients)):
        ctx = context(loop, i)
        part.setup(ctx)
        up = part.upload(ctx)
        assert torch.equal(up["mask"], s1) and len(up["logits"]) == 50  # only this round's samples go up
        uploads.append(up)
    result = agg.aggregate(uploads, loop.parts.facts.server_context(1))
    assert torch.equal(result.keep, s1)  # every sampled sample, and no other
    assert SelectiveFD().client_part().round_sample(loop.parts.facts.info(1)) is None  # default: the whole public set


def test_a_fit_with_features_and_sampling_distils_on_the_sample_only():
    agg = SelectiveFD(features="penultimate", public_per_round=40, server_threshold=2.0)
    loop = tiny(agg)
    loop.fit()
    for m in loop.history:
        assert 0 < m["teacher/kept_fraction"] <= 40 / 120


@pytest.mark.parametrize("kwargs", [{"features": "pixels"}, {"features": "backbone"},
                                    {"backbone": "some/model"}, {"public_per_round": 0}])
def test_bad_feature_settings_name_their_field(kwargs):
    with pytest.raises(ConfigError, match=r"aggregator\.(features|backbone|public_per_round)"):
        SelectiveFD(**kwargs)


def test_a_backbone_whose_weights_are_absent_fails_saying_what_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_cache"))
    with pytest.raises(ConfigError, match=r"aggregator\.backbone.*huggingface-cli download org/absent-vit"):
        SelectiveFD(features="backbone", backbone="org/absent-vit")


def test_a_local_frozen_backbone_gives_the_selectors_its_features(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=12, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=16)
    transformers.ViTModel(cfg).save_pretrained(tmp_path / "vit")
    agg = SelectiveFD(features="backbone", backbone=str(tmp_path / "vit"), per_class=False,
                                auxiliary="public")
    loop = tiny(agg)
    part = agg.client_part()
    feats = part.backbone_features(loop.parts.tensors.public_x)
    assert feats.shape == (len(loop.parts.tensors.public_x), 12)
    ctx = context(loop, 0)
    part.setup(ctx)  # fitted once: a frozen backbone's features never change
    cd = loop.view.client_data[0]
    expected = part.client_mask(part.backbone_features(cd.train.x), cd.train.y, part.backbone_features(cd.calibration.x),
                               cd.calibration.y, loop.view.clients[0].classes, feats, seed=ctx.info.client_seed(0))
    assert torch.equal(ctx.state["selective_mask"], expected)


def test_the_joint_loss_is_alpha_private_plus_one_minus_alpha_proxy():
    torch.manual_seed(0)
    agg = SelectiveFD(private_weight=0.3)
    px, py = torch.randn(7, 5), torch.randint(0, 4, (7,))
    qx, teacher = torch.randn(13, 5), torch.softmax(torch.randn(13, 4), -1)
    x, t = agg.client_part().distillation_set(DistillationContext(0, qx, teacher, px, py))
    assert x.shape == (20, 5) and torch.equal(x[:7], px) and torch.equal(x[7:], qx)
    net = torch.nn.Linear(5, 4)
    logp = net(x).log_softmax(-1)
    joint = torch.nn.functional.cross_entropy(net(x), t)  # what the public step computes on the union
    expected = 0.3 * torch.nn.functional.nll_loss(logp[:7], py) + 0.7 * -(teacher * logp[7:]).sum(-1).mean()
    torch.testing.assert_close(joint, expected)
    # without alpha, the public phase sees the public samples and the teacher only
    x0, t0 = SelectiveFD().client_part().distillation_set(DistillationContext(0, qx, teacher, px, py))
    assert x0 is qx and t0 is teacher
    with pytest.raises(ConfigError, match=r"aggregator\.private_weight"):
        SelectiveFD(private_weight=1.0)


def test_a_fit_with_the_joint_loss_distils_on_private_and_kept_public_samples():
    agg = SelectiveFD(private_weight=0.5, client_selector=False, server_threshold=2.0, public_per_round=30)
    loop = tiny(agg, rounds=1)
    seen = []
    train = loop.settings.executor.train

    def spy(clients, phase, datasets, *args):
        seen.append((phase, [len(x) for x, _ in datasets]))
        return train(clients, phase, datasets, *args)

    loop.settings.executor.train = spy
    loop.fit()
    public = [sizes for phase, sizes in seen if phase == "public"]
    assert public == [[len(cd.train.x) + 30 for cd in loop.view.client_data]]


def test_selectors_evaluated_on_some_rows_give_the_full_mask_on_those_rows():
    """Penultimate selectors are refitted every round but only the round's sampled rows are
    evaluated: the same mask there as evaluating every row, off elsewhere; every row still spans the
    auxiliary box."""
    loop = tiny(SelectiveFD(features="penultimate"))
    part = SelectiveFD(features="penultimate").client_part()
    cd, client = loop.view.client_data[1], loop.view.clients[1]
    args = (penultimate_features(client, cd.train.x), cd.train.y, penultimate_features(client, cd.calibration.x),
            cd.calibration.y, client.classes, penultimate_features(client, loop.parts.tensors.public_x))
    full = part.client_mask(*args, seed=3)
    rows = torch.zeros(len(loop.parts.tensors.public_x), dtype=torch.bool)
    rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))[:40]] = True
    some = part.client_mask(*args, seed=3, rows=rows)
    assert 0 < int(full.sum()) < len(full)
    assert torch.equal(some, full & rows)
