"""The privacy section: the Gaussian mechanism on uploads and its accountant, the encodings and
their bytes, the budget stop, the membership-inference audit. Executors and resume: digits_dp.yaml
in the composition matrix (tests/test_composition.py)."""

import math

import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from fdlit.cli import main
from fdlit.federation.communication import CommunicationLedger
from fdlit.privacy import UploadPrivacy, decode, encode, encoded_bytes, membership_auc, sampled_epsilon
from fdlit.runs import read_jsonl
from tests.fitting import fit_loop, only_run, tiny, without_time

DP = ("--privacy.noise_multiplier", "0.8", "--privacy.clip_norm", "2.0", "--privacy.delta", "1e-4")


@pytest.mark.parametrize("encoding", ["full", "hard", "top_k", "quantised"])
@pytest.mark.parametrize("num_classes", [10, 300])
def test_encodings_count_exactly_what_is_sent_and_decode_to_distributions(encoding, num_classes):
    n, k, bits = 37, 3, 5
    logits = torch.randn(n, num_classes, generator=torch.Generator().manual_seed(num_classes)) * 3  # seeded: fp16 can make a near-tie a tie
    messages = encode(logits, encoding, torch.float16, top_k=k, bits=bits)
    ledger = CommunicationLedger()
    for kind, t in messages.items():
        ledger.send(1, 0, "up", kind, t)
    assert ledger.total("up") == encoded_bytes(n, num_classes, encoding, 2, top_k=k, bits=bits)
    assert ledger.total("up") == sum(t.numel() * t.element_size() for t in messages.values())
    probs = decode(messages, encoding, num_classes, n, bits=bits).float().softmax(-1)
    assert torch.allclose(probs.sum(-1), torch.ones(n), atol=1e-5)
    truth = logits.softmax(-1)
    assert torch.equal(probs.argmax(-1), truth.argmax(-1)) or encoding == "quantised"
    if encoding == "hard":
        assert torch.allclose(probs, torch.nn.functional.one_hot(truth.argmax(-1), num_classes).float(), atol=1e-9)
    if encoding == "top_k":  # the k largest survive (to fp16), the rest shares what is left evenly
        top = truth.topk(k, -1)
        assert torch.allclose(probs.gather(-1, top.indices), top.values, atol=2e-3)
    if encoding == "quantised":  # error <= half a level of the row maximum, before renormalising
        levels = 2**bits - 1
        q = decode(messages, encoding, num_classes, n, bits=bits).exp()
        unnormalised = q * (torch.round(truth / truth.amax(-1, keepdim=True) * levels) / levels
                            * truth.amax(-1, keepdim=True)).sum(-1, keepdim=True)
        assert (unnormalised - truth).abs().max() <= truth.amax() / levels / 2 + 2e-3


def test_the_mechanism_clips_rows_and_adds_noise_of_sigma_times_the_sensitivity():
    n, c, sigma = 400, 10, 0.5
    logits = torch.randn(n, c, generator=torch.Generator().manual_seed(0)) * 10
    sent = {}

    def send(r, i, messages):
        sent[i] = messages
        return messages

    quiet = UploadPrivacy(noise_multiplier=1e-9, clip_norm=c)
    uploads, stats = quiet.upload(1, [{"logits": logits}], torch.float32, 0, c, 1.0, send)
    assert uploads[0]["logits"].norm(dim=-1).max() <= c + 1e-4
    assert stats["privacy/clipped_fraction"] == pytest.approx(int((logits.norm(dim=-1) > c).sum()) / n, abs=1e-12)
    loud = UploadPrivacy(noise_multiplier=sigma, clip_norm=1.0)
    small = logits / logits.norm(dim=-1, keepdim=True) * 0.5  # inside the ball: only noise is added
    uploads, stats = loud.upload(1, [{"logits": small}], torch.float32, 0, c, 1.0, send)
    expected_std = sigma * 2 * 1.0 * math.sqrt(n)  # sigma x Delta, Delta = 2c sqrt(rows)
    assert stats["privacy/noise_std_mean"] == pytest.approx(expected_std)
    assert (uploads[0]["logits"] - small).std().item() == pytest.approx(expected_std, rel=0.05)
    again, _ = UploadPrivacy(noise_multiplier=sigma, clip_norm=1.0).upload(1, [{"logits": small}], torch.float32, 0,
                                                                          c, 1.0, send)
    assert torch.equal(again[0]["logits"], uploads[0]["logits"])  # seeded per (seed, round, client)


@pytest.mark.parametrize("executor", ["SequentialExecutor", "VectorizedExecutor"])
def test_the_server_receives_each_clients_release_of_its_own_logits(tmp_path, executor):
    """The release is a client step: what reaches the server's side is, for each client, the
    clipped and noised (and encoded) version of that client's own public logits, with its own noise
    stream; the server only decodes and accounts it."""
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    argv = tiny("digits_avg.yaml", tmp_path, *DP, "--privacy.encoding", "full",
                "--federation.executor", f"fdlit.execution.{executor}")
    parser, cfg = parse_fit(argv)
    loop = Experiment(cfg, parser).loop
    seen, receive = [], loop.privacy.receive

    def spy(at, messages):
        r, ids = at.round, at.clients
        info = loop.parts.facts.info(r, (), None)
        raw = [loop.settings.executor.predict([loop.view.clients[i]], info.public_x)[0] for i in ids]
        seen.append((r, list(ids), list(messages), raw))
        return receive(at, messages)

    loop.privacy.receive = spy
    loop.fit()
    assert [r for r, *_ in seen] == [1, 2]
    for r, ids, messages, raw in seen:
        for i, message, logits in zip(ids, messages, raw, strict=True):
            expected = loop.parts.clients.release(r, i, {"logits": logits})
            assert set(message) == {"logits"}  # the arrays sent; the release's diagnostics are metrics
            assert set(message.metrics) == {"privacy/clipped_rows", "privacy/released_rows", "privacy/noise_std"}
            assert torch.allclose(message["logits"], expected["logits"], atol=1e-5)
            assert (message["logits"] - logits).abs().mean() > 1.0  # noised (std 0.8 x 2 x 2 x sqrt(120)), not raw
        assert not torch.equal(messages[0]["logits"] - raw[0], messages[1]["logits"] - raw[1])  # a stream per client


def test_epsilon_after_each_round_is_the_accountants_own(tmp_path):
    loop = fit_loop(tiny("digits_avg.yaml", tmp_path, *DP))
    reference = RDPAccountant()
    for r, metrics in enumerate(loop.history, start=1):
        reference.step(noise_multiplier=0.8, sample_rate=1.0)
        assert metrics["privacy/epsilon"] == pytest.approx(reference.get_epsilon(1e-4), rel=1e-12)
        orders = RDPAccountant.DEFAULT_ALPHAS
        eps, _ = get_privacy_spent(orders=orders, rdp=compute_rdp(q=1.0, noise_multiplier=0.8, steps=r, orders=orders),
                                   delta=1e-4)
        assert metrics["privacy/epsilon"] == pytest.approx(eps, rel=1e-12)
    assert loop.history[1]["privacy/epsilon"] > loop.history[0]["privacy/epsilon"] > 0


def test_sigma_0_and_full_logits_reproduce_the_run_without_privacy(tmp_path):
    plain = fit_loop(tiny("digits_avg.yaml", tmp_path / "plain"))
    zero = fit_loop(tiny("digits_avg.yaml", tmp_path / "zero", "--privacy.noise_multiplier", "0",
                         "--privacy.clip_norm", "0.01", "--privacy.encoding", "full"))
    assert without_time(zero.history) == without_time(plain.history)
    assert zero.server_side.ledger.rows() == plain.server_side.ledger.rows()
    assert not any(k.startswith("privacy/") for k in zero.history[-1])


def test_suwa_density_is_noised_in_the_same_release_and_the_audit_reports_auc(tmp_path):
    loop = fit_loop(tiny("digits.yaml", tmp_path, *DP, "--privacy.audit", "true"))
    n = 120
    rows = [m for m in loop.server_side.ledger.messages if m.round == 1 and m.kind == "gmm_means"]
    assert len(rows) == 4
    k = rows[0].shape[0]  # the noise covers the logits and both density parts: N + 2K rows
    assert loop.history[0]["privacy/noise_std_mean"] >= 0.8 * 2 * 2.0 * math.sqrt(n + 2 * 1) - 1e-9
    assert loop.history[0]["privacy/noise_std_mean"] <= 0.8 * 2 * 2.0 * math.sqrt(n + 2 * k) + 1e-9
    assert "privacy/mia_auc" not in loop.history[0]
    aucs = loop.history[-1]["clients/privacy/mia_auc"]
    assert len(aucs) == 4 and all(0 <= a <= 1 for a in aucs)
    assert loop.history[-1]["privacy/mia_auc"] == pytest.approx(sum(aucs) / 4)


def test_membership_auc_is_the_mann_whitney_statistic():
    assert membership_auc(torch.tensor([3.0, 4.0]), torch.tensor([1.0, 2.0])) == 1.0
    assert membership_auc(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])) == 0.0
    assert membership_auc(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 3.0])) == pytest.approx((1 + 0.5) / 4)  # one win, one tie of four pairs


def test_the_budget_stops_after_the_last_round_within_it_with_the_round_checkpointed(tmp_path, capsys):
    one = RDPAccountant()
    one.step(noise_multiplier=0.8, sample_rate=1.0)
    budget = one.get_epsilon(1e-4) * 1.2  # round 1 fits, round 2 does not
    argv = tiny("digits_avg.yaml", tmp_path, *DP, "--privacy.epsilon_budget", str(budget))
    assert main(["fit", *argv]) == 0
    run = only_run(tmp_path)
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["round"] for m in metrics] == [1] and metrics[0]["privacy/epsilon"] <= budget
    assert torch.load(run / "checkpoint.pt", weights_only=False)["loop"]["round"] == 1
    err = capsys.readouterr().err
    assert "fdlit: stopped: privacy budget reached: round 2 would raise epsilon" in err
    assert len([line for line in err.splitlines() if "budget" in line]) == 1


def test_hard_labels_with_uwa_scores_and_refused_with_uwa_density(tmp_path):
    loop = fit_loop(tiny("digits.yaml", tmp_path / "a", "--privacy.encoding", "hard", "--aggregator.upload", "scores"))
    kinds = {m.kind for m in loop.server_side.ledger.messages if m.direction == "up"}
    assert kinds == {"labels", "log_likelihood"}
    assert all(m.dtype == "uint8" and m.bytes == 120 for m in loop.server_side.ledger.messages if m.kind == "labels")
    assert main(["fit", *tiny("digits.yaml", tmp_path / "b", "--privacy.encoding", "hard")]) == 2
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # Opacus's PRV logs log(0) at sample rate 1
def test_the_prv_accountant_composes_each_clients_rounds_at_sample_rate_1():
    from opacus.accountants import PRVAccountant

    privacy = UploadPrivacy(noise_multiplier=1.3, clip_norm=1.0, accountant="prv")
    reference = PRVAccountant()
    for r, q in enumerate([1.0, 1.0, 0.5], start=1):
        _, stats = privacy.upload(r, [{"logits": torch.randn(8, 3)}], torch.float32, 0, 3, q, lambda r, i, m: m)
        reference.step(noise_multiplier=1.3, sample_rate=1.0)  # the client took part: no amplification
        assert stats["privacy/epsilon"] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)
    assert privacy.history == [(1.3, 1.0, 2), (1.3, 0.5, 1)]
    restored = UploadPrivacy(noise_multiplier=1.3, clip_norm=1.0, accountant="prv")
    restored.load_state_dict(privacy.state_dict())
    assert restored.epsilon() == privacy.epsilon()


def direct_sampled_epsilon(sigma: float, q: float, rounds: int, delta: float) -> float:
    """The before-sampling bound computed term by term (orders up to 20, where exp does not overflow
    and the optimum lies for these settings)."""
    orders = [a for a in RDPAccountant.DEFAULT_ALPHAS if a <= 20]
    rdp = [rounds * math.log(1 - q + q * math.exp((a - 1) * a / (2 * sigma**2))) / (a - 1) for a in orders]
    return get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0]


@pytest.mark.parametrize(("sigma", "q", "rounds", "expected"),
                         [(1.0, 0.25, 20, 17.04), (1.0, 1.0, 20, 30.13), (1.0, 0.1, 50, 18.05)])
def test_the_bound_before_sampling_is_the_mixture_of_nothing_and_the_gaussian_release(sigma, q, rounds, expected):
    eps = sampled_epsilon([(sigma, q, rounds)], 1e-5)
    assert eps == pytest.approx(direct_sampled_epsilon(sigma, q, rounds, 1e-5), rel=1e-9)
    assert eps == pytest.approx(expected, abs=0.01)
    amplified = RDPAccountant()
    amplified.history = [(sigma, q, rounds)]
    if q < 1:  # Opacus's sampled Gaussian assumes the sample is hidden: a smaller, here invalid, epsilon
        assert amplified.get_epsilon(1e-5) < eps - 5
    else:
        assert amplified.get_epsilon(1e-5) == pytest.approx(eps, rel=1e-9)


def test_per_client_epsilon_composes_the_rounds_each_client_took_part_in():
    privacy = UploadPrivacy(noise_multiplier=0.8, clip_norm=1.0, delta=1e-4)
    rounds = [[0, 1], [1], [1, 2], [1]]  # client 1 takes part 4 times, client 0 once, client 2 once
    for r, ids in enumerate(rounds, start=1):
        payloads = [{"logits": torch.randn(6, 3)} for _ in ids]
        _, stats = privacy.upload(r, payloads, torch.float32, 0, 3, 0.5, lambda r, i, m: m, ids)
        most = max(sum(i in s for s in rounds[:r]) for i in range(3))
        reference = RDPAccountant()
        reference.history = [(0.8, 1.0, most)]
        assert stats["privacy/epsilon"] == pytest.approx(reference.get_epsilon(1e-4), rel=1e-12)
        assert stats["privacy/epsilon_sampled"] == pytest.approx(direct_sampled_epsilon(0.8, 0.5, r, 1e-4), rel=1e-9)
    for client in range(3):
        times = sum(client in s for s in rounds)
        reference = RDPAccountant()
        for _ in range(times):
            reference.step(noise_multiplier=0.8, sample_rate=1.0)
        assert privacy.accountant.composed(privacy.accountant.clients[client]) == pytest.approx(
            reference.get_epsilon(1e-4), rel=1e-12)
    # the budget check assumes the worst: every client takes part in the next round
    worst = RDPAccountant()
    worst.history = [(0.8, 1.0, 5)]
    assert privacy.accountant.epsilon_after_next(0.8) == pytest.approx(worst.get_epsilon(1e-4), rel=1e-12)
    restored = UploadPrivacy(noise_multiplier=0.8, clip_norm=1.0, delta=1e-4)
    restored.load_state_dict(privacy.state_dict())
    assert restored.epsilon() == privacy.epsilon() and restored.accountant.clients == privacy.accountant.clients
    legacy = UploadPrivacy(noise_multiplier=0.8, clip_norm=1.0, delta=1e-4)  # a checkpoint of every round only
    legacy.load_state_dict({"history": [[0.8, 0.5, 4]]})
    assert legacy.epsilon() == pytest.approx(worst_of(4), rel=1e-12)  # every client counted in every round


def worst_of(rounds: int) -> float:
    reference = RDPAccountant()
    reference.history = [(0.8, 1.0, rounds)]
    return reference.get_epsilon(1e-4)


def test_with_half_the_clients_sampled_epsilon_counts_the_rounds_each_client_uploaded(tmp_path):
    loop = fit_loop(tiny("digits_avg.yaml", tmp_path, *DP, "--federation.participation.fraction", "0.5", rounds=3))
    taken = {i: 0 for i in range(len(loop.view.clients))}
    for r, metrics in enumerate(loop.history, start=1):
        assert metrics["privacy/sample_rate"] == 0.5
        up = {m.client for m in loop.server_side.ledger.messages if m.round == metrics["round"] and m.direction == "up"}
        assert up == set(metrics["participation/arrived"]) and len(up) < len(loop.view.clients)
        for i in up:
            taken[i] += 1
        assert metrics["privacy/epsilon"] == pytest.approx(worst_of(max(taken.values())), rel=1e-12)
        assert metrics["privacy/epsilon_sampled"] == pytest.approx(direct_sampled_epsilon(0.8, 0.5, r, 1e-4), rel=1e-9)


def test_runs_saved_before_the_threat_model_knob_keep_their_fingerprint():
    from fdlit.runs.checkpoint import config_fingerprint

    before = {"seed": 0, "privacy": {"noise_multiplier": 0.8, "clip_norm": 2.0, "encoding": "full"}}
    now = {"seed": 0, "privacy": {**before["privacy"], "accounting": "local"}}
    assert config_fingerprint(now) == config_fingerprint(before)
    assert config_fingerprint({**now, "privacy": {**now["privacy"], "accounting": "central"}}) != config_fingerprint(before)


@pytest.mark.parametrize("config", ["digits_fedavg.yaml", "digits_fedproto.yaml"])
def test_an_encoding_for_a_method_that_uploads_no_logits_is_refused_before_any_work(config, tmp_path, capsys):
    # parameters or prototypes: an encoding of the public logits would be accepted and do nothing
    runs = tmp_path / "runs"
    assert main(["fit", "--config", config, "--privacy.encoding", "top_k", "--logger.mode", "disabled",
                 "--logger.run_dir", str(runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: privacy.encoding: 'top_k' encodes the public logits, "
                                               "which ") and err[0].endswith("does not upload; allowed: full"), err
    assert not any(runs.rglob("metrics.jsonl"))  # no round ran
