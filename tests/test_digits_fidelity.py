"""Aggregators on clients really trained on digits (k = 2 classes per client, M = 20, configs/digits.yaml):
what a rule's weights measure once clients differ. One private phase is trained once for the module
(about 10 s on a CPU); every test aggregates the clients' real uploads."""

import warnings

import pytest
import torch

from fdlit.configuration.schema import parse_fit
from fdlit.methods import (
    LKD,
    ProbabilityAveraging,
    SmoothedUncertaintyWeighted,
    UncertaintyWeighted,
)
from fdlit.runs.experiment import Experiment


@pytest.fixture(scope="module")
def digits_k2(tmp_path_factory):
    """20 digits clients with 2 classes each after a 20-epoch private phase (seed 0), and their public logits."""
    argv = ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path_factory.mktemp("runs"))]
    loop = Experiment(parse_fit(argv)[1]).loop
    loop.setup()
    loop.settings.executor.train(loop.view.clients, "private", loop.parts.tensors.private,
                                 loop.settings.private_epochs_first, loop.optimization.batch_size)
    loop.settings.executor.teardown(loop.view.clients)
    return loop


def public_logits(loop):
    return torch.stack([c.predict_logits(loop.parts.tensors.public_x) for c in loop.view.clients])


def uploads(loop, agg, z=None):
    """What every client sends for ``agg`` in round 1, its public logits included."""
    z = public_logits(loop) if z is None else z
    extra = loop.settings.executor.client_hook("upload", agg.client_part(), loop.parts.facts.info(1), loop.view.clients,
                                               loop.view.client_data, loop.server_side.received, z)
    return [payload.with_arrays({"logits": z[i], **payload.arrays}) for i, payload in enumerate(extra)]


def holders(loop):
    """M x N: 1 where the public sample's true class is one of the client's classes (diagnostic only)."""
    y = loop.parts.tensors.public_y.cpu()
    return torch.stack([torch.isin(y, torch.tensor(cd.classes)) for cd in loop.view.client_data]).float()


def holder_weight(weights, loop):
    """Mean over public samples of the total weight on the clients that hold the sample's class."""
    return float((weights.cpu() * holders(loop)).sum(0).mean())


# ---------------------------------------------------------------- LKD (F2L, Nguyen et al. 2022)
def test_lkd_scored_against_the_public_set_differs_from_avg_and_favours_the_class_holders(digits_k2):
    loop = digits_k2
    m, n = len(loop.view.clients), len(loop.parts.tensors.public_y)
    avg = ProbabilityAveraging().aggregate(uploads(loop, ProbabilityAveraging()), loop.parts.facts.server_context(1))
    agg = LKD()  # scoring: calibration_vs_public, T_w = 20
    ups = uploads(loop, agg)
    r = agg.aggregate(ups, loop.parts.facts.server_context(1))
    auc = torch.stack([u["class_auc"] for u in ups])
    for i, cd in enumerate(loop.view.client_data):  # unseen classes 0; own classes in (0.5, 1): public holds all
        own = torch.zeros(10, dtype=torch.bool)
        own[cd.classes] = True
        assert (auc[i, ~own] == 0).all() and (auc[i, own] > 0.5).all() and (auc[i, own] < 1).all()
    torch.testing.assert_close(r.weights.sum(0), torch.ones(n))
    print("LKD calibration_vs_public: max |W - 1/M| =", float((r.weights - avg.weights).abs().max()),
          "holder weight", holder_weight(r.weights, loop), "teacher acc",
          float((r.teacher.argmax(-1) == loop.parts.tensors.public_y).float().mean()), "AVG teacher acc",
          float((avg.teacher.argmax(-1) == loop.parts.tensors.public_y).float().mean()))
    assert float((r.weights - avg.weights).abs().max()) > 0.03  # not AVG's 1/M
    # each class has 4 of the 20 clients, so AVG puts 4/20 on the holders; LKD puts more
    assert holder_weight(avg.weights, loop) == pytest.approx(4 / m)
    assert holder_weight(r.weights, loop) > 4 / m + 0.005


def test_lkd_scored_on_own_calibration_only_is_avg_when_every_class_has_as_many_holders(digits_k2):
    """Why calibration_vs_public is the default: on its own classes every holder scores ~1, so beta is
    ~uniform over the holders of each class and, with 4 holders per class, W ~ 1/M."""
    loop = digits_k2
    agg = LKD(scoring="calibration")
    r = agg.aggregate(uploads(loop, agg), loop.parts.facts.server_context(1))
    print("calibration-only LKD: max |W - 1/M| =", float((r.weights - 1 / len(loop.view.clients)).abs().max()),
          "holder weight", holder_weight(r.weights, loop))
    assert float((r.weights - 1 / len(loop.view.clients)).abs().max()) < 0.005
    assert holder_weight(r.weights, loop) == pytest.approx(4 / len(loop.view.clients), abs=1e-3)


# ---------------------------------------------------------------- UWA / sUWA (Kovalchuk et al. 2026): degenerate fits
def collapse(monkeypatch, client, row):
    """The client's model ignores its input: every logit row it produces (calibration and public) is ``row``."""
    monkeypatch.setattr(client, "predict_logits", lambda x, batch_size=1024: row.to(x.device).expand(len(x), -1).clone())


@pytest.mark.parametrize("upload", ["density", "scores"])
@pytest.mark.parametrize("make", [lambda **kw: UncertaintyWeighted(**kw),
                                  lambda **kw: SmoothedUncertaintyWeighted(tau=0.25, **kw)],
                         ids=["uwa", "suwa-0.25"])
def test_a_collapsed_client_no_longer_takes_the_weight(digits_k2, monkeypatch, make, upload):
    loop = digits_k2
    m = len(loop.view.clients)
    own = loop.view.client_data[0].classes[0]
    collapse(monkeypatch, loop.view.clients[0], 8.0 * torch.nn.functional.one_hot(torch.tensor(own), 10).float())
    z = public_logits(loop)
    assert (z[0] == z[0, :1]).all()  # identical rows

    paper = make(upload=upload, robust=False)  # the rule as written: its floored density spikes everywhere
    r = paper.aggregate(uploads(loop, paper, z), loop.parts.facts.server_context(1))
    assert float(r.weights[0].mean()) > 0.99

    agg = make(upload=upload)  # robust (default)
    with pytest.warns(RuntimeWarning, match="1 collapsed clients"):
        r = agg.aggregate(uploads(loop, agg, z), loop.parts.facts.server_context(1))
    assert float(r.weights[0].mean()) < 2 / m
    assert r.stats["density/collapsed_clients"] == 1.0 and r.stats["density/dropped_components"] == 2.0
    torch.testing.assert_close(r.weights.sum(0), torch.ones(len(loop.parts.tensors.public_y)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the next round is only counted
        assert agg.aggregate(uploads(loop, agg, z), loop.parts.facts.server_context(1)).stats["density/collapsed_clients"] == 1.0


@pytest.mark.parametrize("mix", ["probabilities", "logits"])
@pytest.mark.parametrize("tau", [1.0, 0.25])
def test_robust_rule_changes_nothing_when_no_fit_is_degenerate(digits_k2, tau, mix):
    loop = digits_k2
    z = public_logits(loop)
    before = SmoothedUncertaintyWeighted(tau=tau, mix=mix, robust=False)
    after = SmoothedUncertaintyWeighted(tau=tau, mix=mix)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to repair, nothing said
        r = after.aggregate(uploads(loop, after, z), loop.parts.facts.server_context(1))
    r0 = before.aggregate(uploads(loop, before, z), loop.parts.facts.server_context(1))
    assert torch.equal(r.teacher, r0.teacher) and torch.equal(r.weights, r0.weights)
    assert all(r.stats[f"density/{k}"] == 0 for k in ("collapsed_clients", "degenerate_components",
                                                       "shrunk_components", "dropped_components"))
