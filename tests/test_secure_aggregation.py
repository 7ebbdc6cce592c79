"""Secure aggregation: masked sums equal plain ones within the fixed-point error, dropouts are recovered,
the server's rule sees only the sum, rules that need individual uploads are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fdlit.methods
from fdlit.cli import main
from fdlit.messages import Message
from fdlit.methods import ProbabilityAveraging, SmoothedUncertaintyWeighted
from fdlit.privacy.secure_sum import (
    decode,
    encode,
    fixed_point_error,
    scale_bits,
    secure_sum,
    shamir_reconstruct,
    shamir_share,
)
from fdlit.privacy.secure_upload import SecureSums
from tests.fitting import fit_loop, tiny

PARTIAL = ("--federation.participation.dropout", "0.3")


def test_shamir_rebuilds_from_any_t_shares_and_not_from_fewer():
    secret = 2**255 + 12345
    shares = shamir_share(secret, 7, 4)
    assert shamir_reconstruct(shares[:4]) == secret == shamir_reconstruct(shares[3:])
    assert shamir_reconstruct(shares[:3]) != secret


def test_masked_sum_equals_the_plain_sum_with_a_dropout_after_sharing_recovered():
    rng = np.random.default_rng(0)
    sampled, dropped = list(range(6)), {1, 4}  # 1 and 4 shared their keys, then never sent their masked input
    xs = {u: rng.uniform(-3, 3, 50) for u in sampled}
    bits = scale_bits(3.0, len(sampled))
    vectors = {u: encode(xs[u], 3.0, bits) for u in sampled if u not in dropped}
    sent = []
    total, stats = secure_sum(sampled, vectors, lambda *m: sent.append(m), round=3)
    survivors = [u for u in sampled if u not in dropped]
    exact = sum(xs[u] for u in survivors)
    # masks cancel exactly: the decoded sum is the sum of the fixed-point encodings, bit for bit
    assert np.array_equal(decode(total, bits), decode(sum(vectors.values()), bits))
    assert np.abs(decode(total, bits) - exact).max() <= fixed_point_error(len(sampled), bits) + 1e-12
    assert stats["secagg/dropped_after_sharing"] == 2 and stats["secagg/failed"] == 0
    masked = {c: a for c, _, kind, a in sent if kind == "secagg_masked"}
    assert set(masked) == set(survivors)
    for u in survivors:  # what the server received from u is not u's encoding (nor anything close)
        assert np.abs(decode(masked[u], bits) - xs[u]).mean() > 10  # uniform over +-2^(63-s) = +-64
    # without the dropped clients' masks removed the sum would be garbage: the recovery did the work
    assert {"secagg_keys", "secagg_shares", "secagg_unmask", "secagg_survivors"} <= {kind for _, _, kind, _ in sent}


def test_fewer_survivors_than_the_threshold_give_no_sum():
    vectors = {0: encode(np.ones(3), 1.0, 40)}
    total, stats = secure_sum([0, 1, 2, 3], vectors, lambda *m: None)
    assert total is None and stats["secagg/failed"] == 1 and stats["secagg/threshold"] == 2


def suwa_uploads(m: int, n: int = 40, c: int = 5) -> list[Message]:
    g = torch.Generator().manual_seed(1)
    # log-likelihoods below U = 18.43, the largest a density on 5 classes with the default floor reaches, and
    # within the fixed point's range: the largest weight of a sample, exp(tau (l - U)), is above e^-28
    return [Message({"logits": torch.randn(n, c, generator=g) * 3,
                     "log_likelihood": torch.empty(n).uniform_(-10, 18, generator=g)}) for _ in range(m)]


@pytest.mark.parametrize("rule", [ProbabilityAveraging(), SmoothedUncertaintyWeighted(upload="scores"),
                                  SmoothedUncertaintyWeighted(upload="scores", tau=1.0, mix="logits"),
                                  fdlit.methods.EntropyReduction(), fdlit.methods.FedMD()])
def test_a_sum_rule_on_masked_uploads_gives_the_plain_teacher_of_the_survivors(rule):
    uploads, sampled, survivors = suwa_uploads(5), [0, 1, 2, 3, 4], [0, 2, 3, 4]  # client 1 drops after sharing
    sums, stats = masked_rule(rule, sampled, survivors, uploads)
    plain = rule.aggregate([uploads[i] for i in survivors], None).teacher
    secure = rule.aggregate_sums(sums, None).teacher
    assert stats["secagg/dropped_after_sharing"] == 1
    assert torch.allclose(secure, plain, atol=1e-5, rtol=0)  # float32 rounding; the fixed-point error is ~1e-17


def masked_rule(rule, sampled, survivors, uploads, sent=None):
    """The round's masked sums of ``rule`` as the server's privacy layer runs them in ``fit``."""
    from fdlit.privacy import UploadPrivacy
    from fdlit.privacy.secure_round import masked_round

    privacy = UploadPrivacy(secure_aggregation=True)
    privacy.check(rule, uploads[0]["logits"].shape[-1])
    count = (lambda *m: sent.append(m)) if sent is not None else (lambda *m: None)
    return masked_round(privacy, 1, sampled, survivors, [uploads[i] for i in survivors], count, None, 0)


def test_where_no_client_has_a_density_suwa_takes_the_plain_mean_as_its_rule_does():
    rule = SmoothedUncertaintyWeighted(upload="scores", tau=1.0)
    uploads = suwa_uploads(3)
    for u in uploads:
        u["log_likelihood"][:5] = float("-inf")  # no client's density reaches these samples
    sums, _ = masked_rule(rule, [0, 1, 2], [0, 1, 2], uploads)
    result = rule.aggregate_sums(sums, None)
    assert result.stats["density/uniform_fallback_samples"] == 5
    assert torch.allclose(result.teacher, rule.aggregate(uploads, None).teacher, atol=1e-6, rtol=0)


@pytest.mark.parametrize("tau", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("mix", ["probabilities", "logits"])
def test_masked_suwa_is_the_plain_rule_however_low_every_clients_density(tau, mix):
    """The weights are shifted per sample by the masked maximum level, not by a fixed bound: samples that
    every client scores hundreds of nats below the bound keep their softmax over the clients."""
    rule = SmoothedUncertaintyWeighted(upload="scores", tau=tau, mix=mix)
    uploads = suwa_uploads(4)
    g = torch.Generator().manual_seed(5)
    for u in uploads:  # far below U = 18.4 on every client (the fixed bound's weights were all 0 here)
        u["log_likelihood"] = torch.empty(40).uniform_(-200, -60, generator=g)
        u["log_likelihood"][::7] -= 3.0  # and spread: the softmax is far from uniform
    sent = []
    sums, stats = masked_rule(rule, [0, 1, 2, 3], [0, 1, 2, 3], uploads, sent)
    secure, plain = rule.aggregate_sums(sums, None), rule.aggregate(uploads, None)
    assert secure.stats["density/uniform_fallback_samples"] == 0
    assert torch.allclose(secure.teacher, plain.teacher, atol=1e-6, rtol=0)
    assert stats["secagg/extra_exchanges"] == 6  # the shift exchange, then the terms
    assert {k for *_, k, _ in sent} >= {"secagg_shift", "secagg_masked"}


def test_a_score_beyond_its_bound_stops_the_run_in_one_line_not_a_fallback():
    from fdlit.errors import NumericalFault

    rule = SmoothedUncertaintyWeighted(upload="scores", tau=1.0)
    uploads = suwa_uploads(3)
    uploads[1]["log_likelihood"][3] = 500.0  # above U: its weight would overflow the encoding
    sums, _ = masked_rule(rule, [0, 1, 2], [0, 1, 2], uploads)
    with pytest.raises(NumericalFault, match="on 1 public samples a client's score or term exceeds the range"):
        rule.aggregate_sums(sums, None)
    uploads = suwa_uploads(3)
    for u in uploads:  # every client more than W (K - 1) = 992 nats below the bound, and far apart
        u["log_likelihood"][0] = -5000.0
    uploads[0]["log_likelihood"][0] = -1100.0
    sums, _ = masked_rule(rule, [0, 1, 2], [0, 1, 2], uploads)
    with pytest.raises(NumericalFault, match="on 1 public samples every client's scaled score is more than 992"):
        rule.aggregate_sums(sums, None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny digits runs (sUWA, with dropouts) with and without secure aggregation; the secure one with the
    server's rule spied on."""
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    tmp = tmp_path_factory.mktemp("secagg")
    plain = fit_loop(tiny("digits.yaml", tmp / "plain", *PARTIAL, rounds=3))
    parser, cfg = parse_fit(tiny("digits.yaml", tmp / "secure", *PARTIAL, "--privacy.secure_aggregation", "true",
                                 "--privacy.upload_audit", "true", rounds=3))
    loop = Experiment(cfg, parser).loop
    seen = []
    rule = loop.server_side.method
    aggregate_sums = rule.aggregate_sums
    rule.aggregate = lambda uploads, ctx: pytest.fail("the rule was given individual uploads")

    def spy(sums, ctx):
        seen.append(sums)
        return aggregate_sums(sums, ctx)

    rule.aggregate_sums = spy
    loop.fit()
    return plain, loop, seen


def test_the_server_part_sees_only_the_aggregate(runs):
    plain, secure, seen = runs
    assert len(seen) == 3 and all(isinstance(s, SecureSums) for s in seen)
    for s in seen:
        assert set(s.sums) == {"weight", "weighted"}  # sums over clients, one tensor each
        assert s.sums["weighted"].shape == (120, 10) and s.maximum.shape == (120,)
    up = {m.kind for m in secure.server_side.ledger.messages if m.direction == "up"}
    assert up == {"secagg_keys", "secagg_shares", "secagg_masked", "secagg_unmask"}  # no logits, no density
    assert "logits" in {m.kind for m in plain.server_side.ledger.messages if m.direction == "up"}
    # no individual upload to attack: the label audit has nothing; the model audit still queries the clients
    assert "privacy/label_tv" not in secure.history[0] and "privacy/upload_mia_auc" in secure.history[0]


def test_secure_aggregation_changes_no_accuracy_and_counts_its_cost(runs):
    plain, secure, _ = runs
    sent = plain.server_side.ledger.messages
    arrived = [len([m for m in sent if m.round == r and m.kind == "logits"]) for r in (1, 2, 3)]
    assert min(arrived) < 4  # the dropout left clients out of some round: their masks were removed
    dropped = [h["secagg/dropped_after_sharing"] for h in secure.history]
    assert dropped == [4 - a for a in arrived]
    for p, s in zip(plain.history, secure.history, strict=True):
        assert s["teacher/acc"] == pytest.approx(p["teacher/acc"], abs=1e-6)
        assert s["after_public/global_acc_mean"] == pytest.approx(p["after_public/global_acc_mean"], abs=1e-6)
        assert s["comm/up_bytes"] > p["comm/up_bytes"] and s["secagg/extra_exchanges"] == 6  # shift, then terms
        assert s["comm/up/secagg_masked"] > 0 and s["comm/down/secagg_shares"] > 0
        assert s["secagg/fixed_point_error_max"] < 1e-15


@pytest.mark.parametrize(("rule", "words"), [
    ("fdlit.methods.CoordinateMedian", "CoordinateMedian takes a median"),
    ("fdlit.methods.TrimmedMean", "TrimmedMean cuts the most extreme"),
    ("fdlit.methods.EntropyWeighted", "EntropyWeighted's teacher is not declared a sum"),
])
def test_a_rule_that_needs_individual_uploads_is_refused_in_one_line(rule, words, tmp_path, capsys):
    argv = ["fit", *tiny("digits_avg.yaml", tmp_path, "--aggregator", rule, "--privacy.secure_aggregation", "true")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fdlit: error: privacy.secure_aggregation:")
    assert words in err
    assert not list(tmp_path.iterdir())  # refused before any run directory


def test_central_accounting_cannot_turn_secure_aggregation_off(tmp_path, capsys):
    argv = ["fit", *tiny("digits_avg.yaml", tmp_path, "--privacy.accounting", "central",
                         "--privacy.secure_aggregation", "false")]
    assert main(argv) == 2
    assert "privacy.secure_aggregation" in capsys.readouterr().err


def test_central_dp_sums_the_clipped_rows_under_masks(tmp_path):
    loop = fit_loop(tiny("digits_avg.yaml", tmp_path, "--privacy.accounting", "central", "--privacy.noise_multiplier",
                         "0.01", "--privacy.clip_norm", "1", rounds=1))
    kinds = {m.kind for m in loop.server_side.ledger.messages if m.direction == "up"}
    assert "secagg_masked" in kinds and "logits" not in kinds
    assert loop.history[0]["privacy/epsilon"] > 0 and loop.history[0]["secagg/failed"] == 0


def test_fedavg_under_masks_broadcasts_the_plain_weighted_mean_with_dropouts(tmp_path):
    plain = fit_loop(tiny("digits_fedavg.yaml", tmp_path / "plain", *PARTIAL, rounds=3))
    secure = fit_loop(tiny("digits_fedavg.yaml", tmp_path / "secure", *PARTIAL, "--privacy.secure_aggregation",
                           "true", rounds=3))
    up = {m.kind for m in secure.server_side.ledger.messages if m.direction == "up" and m.round > 0}
    assert "parameters" not in up and "secagg_masked" in up  # no client's parameters reach the server
    assert sum(h["secagg/dropped_after_sharing"] for h in secure.history) > 0
    for p, s in zip(plain.history, secure.history, strict=True):
        assert s["after_public/global_acc_mean"] == pytest.approx(p["after_public/global_acc_mean"], abs=1e-6)


@pytest.mark.parametrize(("config", "words"), [
    ("digits_krum.yaml", "Krum scores every upload by its distances"),
    ("digits_feddf.yaml", "FedDF's teacher is not declared a sum"),
])
def test_parameter_rules_that_are_not_sums_are_refused(config, words, tmp_path, capsys):
    assert main(["fit", *tiny(config, tmp_path, "--privacy.secure_aggregation", "true")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
