"""Adversarial clients: each attack changes exactly what it claims, zero attackers change nothing,
the robust rules' defining properties, and bad settings refused before any work."""

import math
from types import SimpleNamespace

import pytest
import torch

from fdlit.adversaries import (
    Adversaries,
    ConfidentWrong,
    FabricatedDensity,
    FreeRider,
    LabelFlipping,
    RandomPredictions,
    ScaledLogits,
    ScaledUpdate,
    SignFlippedUpdate,
)
from fdlit.adversaries.attacks import LAST_TEACHER, START_PARAMETERS
from fdlit.cli import main
from fdlit.methods import (
    CoordinateMedian,
    FedAvg,
    FedMedian,
    FedTrimmedMean,
    Krum,
    ProbabilityAveraging,
    TrimmedMean,
    UncertaintyWeighted,
)
from fdlit.methods.base import ClientContext, FederationInfo, context_for
from fdlit.runs import read_jsonl
from tests.fitting import fit_loop, tiny

N, C = 6, 4


def client_ctx(client_id=1, round=2, public_index=None, received=None, state=None, public_logits=None):
    g = torch.Generator().manual_seed(client_id)
    info = FederationInfo(round=round, seed=0, num_clients=4, num_classes=C, public_x=torch.zeros(N, 1),
                          public_index=public_index)
    logits = public_logits if public_logits is not None else torch.randn(N, C, generator=g)
    return ClientContext(info, SimpleNamespace(client_id=client_id), None, logits, received or {}, state or {})


def density_payload(ctx):
    return {"gmm_means": torch.randn(2, C), "gmm_stds": torch.ones(2, C), "gmm_classes": torch.tensor([0, 1],
            dtype=torch.int16), "_collapsed": torch.tensor([0])}


# ---------------------------------------------------------------- each attack changes what it claims
def test_fabricated_density_leaves_the_predictions_untouched_and_claims_every_row():
    ctx = client_ctx()
    honest = {"logits": ctx.public_logits.clone(), **density_payload(ctx)}
    out = FabricatedDensity(std=0.01).upload(ctx, dict(honest))
    assert torch.equal(out["logits"], honest["logits"]) and torch.equal(out["_collapsed"], honest["_collapsed"])
    assert torch.equal(out["gmm_means"], ctx.public_logits) and bool((out["gmm_stds"] == 0.01).all())
    assert out["gmm_classes"].tolist() == ctx.public_logits.argmax(-1).tolist()
    scores = FabricatedDensity(std=0.01).upload(ctx, {"log_likelihood": torch.zeros(N)})
    assert "logits" not in scores or torch.equal(scores["logits"], ctx.public_logits)
    assert bool((scores["log_likelihood"] > 10).all())


def test_fabricated_density_takes_the_weight_of_uwa():
    """The server evaluates the fabricated mixture on the attacker's own logits: it peaks there."""
    ctxs = [client_ctx(i) for i in range(4)]
    uploads = []
    for ctx in ctxs:
        logits = ctx.public_logits
        gmm = {"gmm_means": logits.mean(0, keepdim=True), "gmm_stds": logits.std(0, keepdim=True),
               "gmm_classes": torch.tensor([0], dtype=torch.int16)}
        uploads.append({"logits": logits, **gmm})
    honest = UncertaintyWeighted().aggregate(uploads, context_for(uploads))
    uploads[2] = FabricatedDensity().upload(ctxs[2], dict(uploads[2]))
    attacked = UncertaintyWeighted().aggregate(uploads, context_for(uploads))
    assert float(honest.weights[2].mean()) < 0.9 < float(attacked.weights[2].mean())


@pytest.mark.parametrize("attack, check", [
    (ConfidentWrong(target=3, confidence=7.0), lambda z, own: bool((z.argmax(-1) == 3).all()) and float(z.max()) == 7),
    (RandomPredictions(kind="uniform"), lambda z, own: bool((z == 0).all())),
    (RandomPredictions(kind="random", scale=2.0), lambda z, own: not torch.equal(z, own) and z.shape == own.shape),
    (ScaledLogits(factor=-3.0), lambda z, own: torch.allclose(z, -3 * own)),
])
def test_prediction_attacks_change_the_logits_only(attack, check):
    ctx = client_ctx()
    extra = {"gmm_means": torch.ones(1, C), "_diagnostic": torch.tensor([5])}
    out = attack.upload(ctx, {"logits": ctx.public_logits.clone(), **extra})
    assert check(out["logits"], ctx.public_logits)
    assert set(out) == {"logits", *extra} and all(torch.equal(out[k], v) for k, v in extra.items())


def test_random_predictions_are_seeded_by_client_and_round():
    attack = RandomPredictions()
    draw = lambda **kw: attack.upload(client_ctx(**kw), {})["logits"]  # noqa: E731
    assert torch.equal(draw(client_id=1, round=2), draw(client_id=1, round=2))
    assert not torch.equal(draw(client_id=1, round=2), draw(client_id=2, round=2))
    assert not torch.equal(draw(client_id=1, round=2), draw(client_id=1, round=3))


def test_free_rider_sends_the_teacher_back_on_this_rounds_rows():
    teacher = torch.softmax(torch.randn(10, C), -1)
    rows = torch.tensor([1, 4, 5, 6, 8, 9])
    ctx = client_ctx(public_index=rows, received={LAST_TEACHER: teacher})
    out = FreeRider().upload(ctx, {})
    assert torch.allclose(out["logits"].softmax(-1), teacher[rows], atol=1e-6)
    first = FreeRider().upload(client_ctx(), {})  # round 1: nothing received yet: uniform
    assert bool((first["logits"] == 0).all())


@pytest.mark.parametrize("attack, scale", [(SignFlippedUpdate(), -1.0), (ScaledUpdate(scale=5.0), 5.0),
                                           (FreeRider(), 0.0)])
def test_update_attacks_scale_the_update_from_the_round_start(attack, scale):
    start, trained = torch.randn(20), torch.randn(20)
    ctx = client_ctx(state={START_PARAMETERS: start})
    out = attack.upload(ctx, {"parameters": trained.clone(), "num_steps": torch.tensor(3)})
    assert torch.allclose(out["parameters"], start + scale * (trained - start))
    assert int(out["num_steps"]) == 3


def test_label_flipping_all_and_targeted():
    y = torch.tensor([0, 1, 2, 3, 9, 5])
    assert LabelFlipping().labels(y, 10).tolist() == [9, 8, 7, 6, 0, 4]
    assert LabelFlipping(source=[1, 3], target=7).labels(y, 10).tolist() == [0, 7, 2, 7, 9, 5]
    ctx = client_ctx()
    payload = {"logits": ctx.public_logits.clone()}
    assert LabelFlipping().upload(ctx, payload) is payload  # uploads what its (poisoned) model predicts


# ---------------------------------------------------------------- who attacks
def test_attackers_fixed_or_redrawn_from_the_seed():
    fixed = Adversaries(LabelFlipping(), fraction=0.25)
    fixed.wrap(object(), "predictions", 20, seed=3)
    assert len(fixed.of_round(1)) == 5 and fixed.of_round(1) == fixed.of_round(7)
    redrawn = Adversaries(LabelFlipping(), count=5, redraw=True)
    redrawn.wrap(object(), "predictions", 20, seed=3)
    rounds = [redrawn.of_round(r) for r in range(1, 6)]
    assert all(len(s) == 5 for s in rounds) and len(set(rounds)) > 1
    again = Adversaries(LabelFlipping(), count=5, redraw=True)
    again.wrap(object(), "predictions", 20, seed=3)
    assert [again.of_round(r) for r in range(1, 6)] == rounds
    listed = Adversaries(LabelFlipping(), ids=[2, 7])
    listed.wrap(object(), "predictions", 20, seed=3)
    assert listed.of_round(4) == {2, 7}


def test_colluding_attackers_send_the_same_upload():
    adv = Adversaries(ConfidentWrong(), ids=[1, 3], collude=True)
    adv.wrap(object(), "predictions", 4, seed=0)
    payloads = [{"logits": torch.full((2, 2), float(i))} for i in range(4)]
    out = adv.collude_uploads(1, [0, 1, 2, 3], payloads)
    assert torch.equal(out[3]["logits"], payloads[1]["logits"]) and out[0] is payloads[0] and out[2] is payloads[2]


# ---------------------------------------------------------------- robust rules
def probs_uploads(logits):
    return [{"logits": z} for z in logits]


def test_median_and_trimmed_mean_of_identical_uploads_equal_avg():
    z = torch.randn(N, C)
    uploads = probs_uploads([z.clone() for _ in range(5)])
    avg = ProbabilityAveraging().aggregate(uploads, context_for(uploads))
    for rule in (CoordinateMedian(), TrimmedMean(beta=0.2)):
        result = rule.aggregate(uploads, context_for(uploads))
        assert torch.allclose(result.teacher, avg.teacher, atol=1e-6)
        assert torch.allclose(result.weights.sum(0), torch.ones(N))


def test_median_ignores_a_minority_of_wild_uploads():
    honest = torch.randn(N, C)
    uploads = probs_uploads([honest + 0.01 * i for i in range(3)] + [torch.full((N, C), -50.0).index_fill(1, torch.tensor([0]), 50.0)] * 2)
    teacher = CoordinateMedian().aggregate(uploads, context_for(uploads)).teacher
    assert torch.allclose(teacher, (honest + 0.01).softmax(-1) / (honest + 0.01).softmax(-1).sum(-1, keepdim=True),
                          atol=1e-5)
    trimmed = TrimmedMean(beta=0.4).aggregate(uploads, context_for(uploads))
    assert float(trimmed.weights[3:].sum(0).max()) < 1e-6  # b = 2 of 5: only the (honest) middle value is left


def param_ctx(n):
    return context_for([{"logits": torch.zeros(1, 1)}] * n)


def test_krum_with_f_0_picks_a_real_clients_update():
    vectors = [torch.randn(50) for _ in range(5)]
    uploads = [{"parameters": v} for v in vectors]
    result = Krum(byzantine=0, selected=1).aggregate(uploads, param_ctx(5))
    chosen = result.broadcast["parameters"]
    assert sum(torch.equal(chosen, v) for v in vectors) == 1
    assert sorted(result.stats["clients/model_share"]) == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_krum_and_the_coordinate_rules_drop_a_far_update():
    honest = [torch.randn(30) * 0.1 for _ in range(5)]
    uploads = [{"parameters": v} for v in honest] + [{"parameters": torch.full((30,), 100.0)}]
    krum = Krum(byzantine=1, selected=3).aggregate(uploads, param_ctx(6))
    assert krum.stats["clients/model_share"][5] == 0.0
    for rule in (FedMedian(), FedTrimmedMean(beta=0.2)):
        out = rule.aggregate(uploads, param_ctx(6)).broadcast["parameters"]
        assert float(out.abs().max()) < 1.0
    mean = FedAvg().aggregate(uploads, param_ctx(6)).broadcast["parameters"]
    assert float(mean.abs().max()) > 10


# ---------------------------------------------------------------- runs
def metrics_of(parent):
    (run,) = [p for p in parent.iterdir() if p.is_dir()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(run / "metrics.jsonl")]


@pytest.mark.parametrize("rule", ["digits.yaml", "digits_era.yaml", "digits_median.yaml", "digits_fedavg.yaml",
                                  "digits_krum.yaml", "digits_fml.yaml"])  # FML: the wrapper passes the pairing on
def test_zero_attackers_change_nothing(rule, tmp_path):
    """No section, and a section with an attack but zero attackers: the same metrics, byte for byte."""
    assert main(["fit", *tiny(rule, tmp_path / "plain")]) == 0
    assert main(["fit", *tiny(rule, tmp_path / "zero", "--adversaries.attack", "fdlit.adversaries.LabelFlipping",
                              "--adversaries.count", "0")]) == 0
    plain, zero = metrics_of(tmp_path / "plain"), metrics_of(tmp_path / "zero")
    assert plain == zero and not any(k.startswith("adversaries/") for k in zero[-1])


def test_an_attack_on_a_two_network_method_keeps_its_pairing(tmp_path):
    """The attack wrapper passes the method's client_network on: FML's clients stay paired."""
    from fdlit.models.mutual import find_pair

    loop = fit_loop(tiny("digits_fml.yaml", tmp_path, "--adversaries.attack", "fdlit.adversaries.LabelFlipping",
                         "--adversaries.ids", "[1]"))
    assert all(find_pair(c.model) is not None for c in loop.view.clients)
    assert loop.history[-1]["adversaries/attackers"] == 1


def test_attack_metrics_of_a_targeted_run(tmp_path):
    loop = fit_loop(tiny("digits_avg.yaml", tmp_path, "--adversaries.attack", "fdlit.adversaries.ConfidentWrong",
                         "--adversaries.attack.target", "2", "--adversaries.ids", "[1]"))
    last = loop.history[-1]
    assert last["adversaries/attackers"] == 1 and math.isclose(last["adversaries/weight"], 0.25, rel_tol=1e-6)
    honest = [a for i, a in enumerate(last["clients/after_public/global_acc"]) if i != 1]
    assert math.isclose(last["adversaries/honest_global_acc"], sum(honest) / 3, rel_tol=1e-6)
    assert 0 <= last["adversaries/attack_success"] <= 1


# ---------------------------------------------------------------- refused before any work
@pytest.mark.parametrize("extra, field", [
    (["--adversaries.attack", "fdlit.adversaries.LabelFlipping", "--adversaries.count", "5"], "adversaries.count"),
    (["--adversaries.attack", "fdlit.adversaries.LabelFlipping", "--adversaries.ids", "[0, 4]"], "adversaries.ids"),
    (["--adversaries.attack", "fdlit.adversaries.LabelFlipping", "--adversaries.count", "1",
      "--adversaries.fraction", "0.5"], "adversaries.fraction"),
    (["--adversaries.attack", "fdlit.adversaries.LabelFlipping"], "adversaries.count"),
    (["--adversaries.count", "2"], "adversaries.attack"),
    (["--adversaries.attack", "fdlit.adversaries.FabricatedDensity", "--adversaries.count", "1"], "adversaries.attack"),
    (["--adversaries.attack", "fdlit.adversaries.SignFlippedUpdate", "--adversaries.count", "1"], "adversaries.attack"),
    (["--adversaries.attack", "fdlit.adversaries.ConfidentWrong", "--adversaries.attack.target", "10",
      "--adversaries.count", "1"], "adversaries.attack.target"),
    (["--adversaries.attack", "fdlit.adversaries.ConfidentWrong", "--adversaries.count", "1",
      "--federation.mode", "local_only"], "adversaries.attack"),
    (["--adversaries.attack", "fdlit.adversaries.NoSuchAttack", "--adversaries.count", "1"], "adversaries.attack"),
])
def test_bad_settings_are_refused_before_any_work(extra, field, tmp_path, capsys):
    assert main(["fit", *tiny("digits_avg.yaml", tmp_path, *extra)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fdlit: error: {field}") and "Traceback" not in err, err
    assert not list(tmp_path.rglob("metrics.jsonl"))


def test_a_parameter_attack_is_refused_under_prediction_exchange_and_vice_versa(tmp_path, capsys):
    assert main(["fit", *tiny("digits_fedavg.yaml", tmp_path, "--adversaries.attack", "fdlit.adversaries.ConfidentWrong",
                              "--adversaries.count", "1")]) == 2
    err = capsys.readouterr().err
    assert "adversaries.attack" in err and "SignFlippedUpdate" in err  # names the attacks that fit


@pytest.mark.parametrize("rule, flags", [
    ("digits_avg.yaml", ["--adversaries.attack", "fdlit.adversaries.FreeRider", "--adversaries.count", "2",
                         "--adversaries.redraw", "true"]),
    ("digits_fedavg.yaml", ["--adversaries.attack", "fdlit.adversaries.SignFlippedUpdate", "--adversaries.count", "1"]),
])
def test_stopped_and_resumed_attacks_equal_an_uninterrupted_run(rule, flags, tmp_path):
    """The free-rider's remembered teacher and the update attacks' round start travel in the checkpoint."""
    assert main(["fit", *tiny(rule, tmp_path / "straight", *flags, rounds=3)]) == 0
    assert main(["fit", *tiny(rule, tmp_path / "stopped", *flags, rounds=3), "--federation.rounds", "2"]) == 0
    (stopped,) = [p for p in (tmp_path / "stopped").iterdir() if p.is_dir()]
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "3"]) == 0
    assert metrics_of(tmp_path / "stopped") == metrics_of(tmp_path / "straight")


def test_attackers_under_client_sampling_count_only_arrived_uploads(tmp_path):
    """Redrawn, colluding attackers with half the clients sampled and some dropped: the metrics count
    the attackers whose uploads arrived, and under AVG their weight is their share of the arrived."""
    loop = fit_loop(tiny("digits_avg.yaml", tmp_path, "--data.num_clients", "6", "--adversaries.attack",
                         "fdlit.adversaries.ConfidentWrong", "--adversaries.count", "3", "--adversaries.redraw", "true",
                         "--adversaries.collude", "true", "--federation.participation.fraction", "0.5",
                         "--federation.participation.dropout", "0.2", rounds=3))
    for m in loop.history:
        arrived = m["participation/arrived"]
        attackers = sum(i in loop.adversaries.of_round(m["round"]) for i in arrived)
        assert m["adversaries/attackers"] == attackers
        if arrived:
            assert math.isclose(m["adversaries/weight"], attackers / len(arrived), rel_tol=1e-5, abs_tol=1e-7)


def test_the_free_rider_remembers_the_teacher_it_was_sent(tmp_path):
    loop = fit_loop(tiny("digits_avg.yaml", tmp_path, "--adversaries.attack", "fdlit.adversaries.FreeRider",
                         "--adversaries.ids", "[1]"))
    teacher = loop.server_side.received[LAST_TEACHER]  # in the checkpoint with the set-up broadcast
    assert teacher.shape == (120, 10) and torch.allclose(teacher.sum(-1), torch.ones(120))
    assert float((teacher - 0.1).abs().max()) > 1e-2  # a real teacher, not the uniform first-round upload
    assert math.isclose(loop.history[-1]["teacher/acc"],
                        float((teacher.argmax(-1) == loop.parts.tensors.public_y).float().mean()), rel_tol=1e-6)


def test_an_attack_fits_the_arrays_a_method_declares_it_uploads(tmp_path, capsys):
    # an attack rewrites an upload the method's client part declares, never one it guesses
    from fdlit.adversaries import FabricatedDensity, FreeRider, RandomPredictions, ScaledUpdate
    from fdlit.methods import FedProto, UncertaintyWeighted
    from tests.fitting import GatedVotes

    assert ScaledUpdate().fits(FedAvg()) and not ScaledUpdate().fits(FedProto())  # prototypes, no parameters
    assert FreeRider().fits(FedAvg()) and not FreeRider().fits(FedProto())
    assert not RandomPredictions().fits(GatedVotes())  # its part sends probabilities and a mask, no logits
    assert FabricatedDensity().fits(UncertaintyWeighted()) and not FabricatedDensity().fits(GatedVotes())
    assert main(["fit", *tiny("digits_fedproto.yaml", tmp_path, "--adversaries.attack", "fdlit.adversaries.ScaledUpdate",
                              "--adversaries.count", "1")]) == 2
    err = capsys.readouterr().err
    assert "ScaledUpdate rewrites the uploaded parameters" in err and "class_counts, prototypes" in err, err
    assert "LabelFlipping" in err and "Traceback" not in err and not list(tmp_path.rglob("metrics.jsonl"))
