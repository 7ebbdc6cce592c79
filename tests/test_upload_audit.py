"""The audits of what FD shares: label-distribution inference from uploads, membership inference from
predictions with the other clients as shadow models."""

from __future__ import annotations

import math

import pytest
import torch

from fdlit.cli import main
from fdlit.privacy.upload_audit import (
    label_histograms,
    label_inference,
    prediction_membership,
    scaled_confidence,
    tpr_at_fpr,
)
from fdlit.runs import read_jsonl
from tests.fitting import only_run, tiny


def test_label_inference_reads_the_predicted_classes_and_measures_total_variation():
    true = label_histograms([torch.tensor([3, 3, 3, 7])], 10)[0]  # 3/4 of class 3, 1/4 of class 7
    z = torch.full((8, 10), -5.0)
    z[:6, 3], z[6:, 7] = 5.0, 5.0  # predicts 3 on 6 samples, 7 on 2: exactly the histogram
    out = label_inference([z], [true])
    assert out["privacy/label_tv"] == pytest.approx(0.0)
    assert out["privacy/label_tv_chance"] == pytest.approx(0.5 * (0.65 + 0.15 + 8 * 0.1))
    z[:, 0] = 10.0  # predicts class 0 everywhere: no overlap with the truth
    assert label_inference([z], [true])["privacy/label_tv"] == pytest.approx(1.0)


def test_tpr_at_low_fpr_and_the_scaled_confidence():
    members, nonmembers = torch.arange(100, 200.0), torch.arange(0, 100.0)
    assert tpr_at_fpr(members, nonmembers) == 1.0
    assert tpr_at_fpr(nonmembers, members) == 0.0
    z = torch.tensor([[[2.0, 0.0, 0.0]]])
    p = z.softmax(-1)[0, 0, 0]
    assert scaled_confidence(z, torch.tensor([0]))[0, 0] == pytest.approx(float(torch.log(p / (1 - p))), rel=1e-6)


def test_the_membership_attack_finds_a_client_that_memorises_and_not_one_that_does_not():
    g = torch.Generator().manual_seed(0)
    m, n, c = 4, 60, 4
    private = [(torch.randn(n, 3, generator=g), torch.full((n,), i % c)) for i in range(m)]
    test_x, test_y = torch.randn(200, 3, generator=g), torch.arange(200) % c
    mask = torch.stack([test_y == i % c for i in range(m)])
    members = torch.cat([x for x, _ in private])

    def predict(memorising: bool):
        def run(x):
            z = torch.zeros(m, len(x), c)
            for i, (own, y) in enumerate(private):
                seen = (x[:, None, :] == own[None]).all(-1).any(-1) if memorising else torch.zeros(len(x), dtype=bool)
                z[i, :, y[0]] = torch.where(seen, 6.0, 1.0) + 0.1 * torch.randn(len(x), generator=g)
            return z
        return run

    leaky = prediction_membership(predict(True), private, test_x, test_y, mask)
    assert leaky["privacy/upload_mia_auc"] > 0.95 and leaky["privacy/upload_mia_tpr_at_1fpr"] > 0.9
    blind = prediction_membership(predict(False), private, test_x, test_y, mask)
    assert abs(blind["privacy/upload_mia_auc"] - 0.5) < 0.1
    assert len(members) == m * n


K2 = ("--data.classes_per_client", "2", "--data.num_clients", "6", "--federation.private_epochs_first", "5",
      "--privacy.upload_audit", "true", "--privacy.clip_norm", "5")


def audited(tmp_path, sigma: str) -> dict:
    assert main(["fit", *tiny("digits_avg.yaml", tmp_path / sigma, *K2, "--privacy.noise_multiplier", sigma,
                              rounds=1)]) == 0
    (row,) = read_jsonl(only_run(tmp_path / sigma) / "metrics.jsonl")
    return row


def test_label_inference_beats_chance_at_k_2_and_its_error_grows_with_dp_noise(tmp_path):
    rows = {s: audited(tmp_path, s) for s in ("0", "0.03", "1")}
    plain = rows["0"]
    assert plain["privacy/label_tv"] < plain["privacy/label_tv_chance"] - 0.2  # far better than the uniform guess
    assert plain["privacy/label_tv_chance"] == pytest.approx(0.8)  # k = 2 of 10 classes, balanced
    errors = [rows[s]["privacy/label_tv"] for s in ("0", "0.03", "1")]
    assert errors[0] < errors[1] < errors[2], errors
    assert len(plain["clients/privacy/label_tv"]) == 6
    assert 0 <= plain["privacy/upload_mia_auc"] <= 1 and math.isfinite(plain["privacy/upload_mia_tpr_at_1fpr"])
