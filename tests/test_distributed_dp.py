"""Central DP with distributed noise: each client adds its share of the Gaussian noise inside the
masked sum (Kairouz et al. 2021), so the server only ever decodes a noisy sum, and the accountant
charges the noise that survived the round's dropouts."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fdlit.cli import main
from fdlit.messages import Message
from fdlit.methods import ProbabilityAveraging
from fdlit.privacy import UploadPrivacy, UploadRound
from fdlit.privacy.client_release import gaussian_noise
from fdlit.privacy.secure_round import NOISE_STREAM, masked_round, share_std
from tests.fitting import only_run, tiny


def central(sigma=0.5, clip=1.0) -> UploadPrivacy:
    privacy = UploadPrivacy(noise_multiplier=sigma, clip_norm=clip, accounting="central")
    privacy.check(ProbabilityAveraging(), 10)
    return privacy


def test_the_server_decodes_the_sum_plus_the_surviving_clients_noise_shares_never_the_exact_sum():
    privacy, seed, r = central(), 7, 3
    g = torch.Generator().manual_seed(0)
    rows = {i: torch.rand(30, 10, generator=g).softmax(-1).double() for i in range(5)}  # clipped probability rows
    sampled, survivors = [0, 1, 2, 3, 4], [0, 2, 3, 4]  # client 1 drops after the key exchange
    sums, stats = masked_round(privacy, r, sampled, survivors, [Message({"logits": rows[i]}) for i in survivors],
                               lambda *m: None, None, seed)
    decoded = sums.sums["logits"]
    exact = sum(rows[i] for i in survivors)
    std = share_std(0.5, 1.0, 30, 5)  # sigma * 2c sqrt(R) / sqrt(n)
    shares = sum(gaussian_noise((30, 10), r, i, seed, std, "cpu", stream=NOISE_STREAM) for i in survivors)
    # what the server decodes is the exact sum plus the survivors' shares (to the fixed point's error) ...
    assert (decoded - exact - shares).abs().max() <= 10 * sums.error["logits"] + 1e-12
    # ... and nowhere the exact sum: the noise is of std sqrt(4) * std per entry
    assert (decoded - exact).std().item() == pytest.approx(2 * std, rel=0.15)
    assert (decoded - exact).abs().min() > 1e-6
    assert stats["secagg/survivors"] == 4 and stats["secagg/clients"] == 5


def test_fewer_survivors_leave_less_noise_and_the_accountant_charges_it():
    privacy = central(sigma=1.0)
    messages = [Message({"logits": torch.full((20, 10), 0.1, dtype=torch.float64)}) for _ in range(3)]
    uploads, stats = privacy.receive(UploadRound(1, [0, 1, 2], 10, 20, 1.0, lambda r, i, m: m, seed=0,
                                                 sampled=[0, 1, 2, 3, 4, 5]), messages)
    assert stats["privacy/noise_multiplier_effective"] == pytest.approx(math.sqrt(3 / 6))
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(math.sqrt(0.5), 1.0, 1)]
    assert stats["privacy/epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    full = central(sigma=1.0)
    _, all_there = full.receive(UploadRound(1, [0, 1, 2], 10, 20, 1.0, lambda r, i, m: m, sampled=[0, 1, 2]),
                                 messages)
    assert all_there["privacy/noise_multiplier_effective"] == 1.0
    assert all_there["privacy/epsilon"] < stats["privacy/epsilon"]  # less surviving noise: larger epsilon


def test_the_epsilon_a_run_prints_is_the_accountants_for_the_noise_that_survived_a_dropout(tmp_path, capsys):
    sigma = 2.0
    argv = ["fit", *tiny("digits_avg.yaml", tmp_path, "--privacy.accounting", "central", "--privacy.noise_multiplier",
                         str(sigma), "--privacy.clip_norm", "1", "--data.num_clients", "6",
                         "--federation.participation.dropout", "0.3", rounds=1)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (row,) = [json.loads(line) for line in (only_run(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    n, m = row["secagg/clients"], row["secagg/survivors"]
    assert m < n, "the seed drops a client after the key exchange"
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(sigma * math.sqrt(m / n), 1.0, 1)]
    expected = accountant.get_epsilon(1e-5)
    assert row["privacy/epsilon"] == pytest.approx(expected, rel=1e-9)
    assert row["privacy/noise_multiplier_effective"] == pytest.approx(sigma * math.sqrt(m / n))
    assert f"epsilon {expected:.4g} at delta 1e-05 per client" in out


def test_an_epsilon_above_10_is_called_no_meaningful_guarantee_in_the_summary(tmp_path, capsys):
    from fdlit.privacy.guarantee import epsilon_meaning

    assert epsilon_meaning(10.0) == "" and epsilon_meaning(None) == ""
    assert epsilon_meaning(10.5) == "no meaningful guarantee (epsilon > 10)"
    argv = ["fit", *tiny("digits_avg.yaml", tmp_path, "--privacy.noise_multiplier", "0.1", "--privacy.clip_norm", "5",
                         rounds=1)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["privacy_epsilon"] > 10 and summary["privacy_epsilon_meaningful"] is False
    assert "; no meaningful guarantee (epsilon > 10)" in out
