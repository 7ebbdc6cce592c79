"""Secure aggregation computes the same rule as the plain form: for UWA (tau = 1, probabilities and the
workshop paper's logits), sUWA (tau = 0.25 and 4) and AVG, a masked run and a plain run on the same seed
give the same teacher every round, through ``python -m fdlit fit``, on digits and on Fashion-MNIST IDX
files in the real format; a run whose round has fewer than 2 survivors records it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fdlit.cli import main
from tests.fitting import only_run, tiny
from tests.paper_fixtures import idx_folder

MASKED = ("--privacy.secure_aggregation", "true")
RULES = {
    "uwa": ("digits_uwa.yaml",),
    "uwa_logits": ("digits_uwa_logits.yaml",),
    "suwa_0.25": ("digits.yaml", "--aggregator.tau", "0.25"),
    "suwa_4": ("digits.yaml", "--aggregator.tau", "4"),
    "avg": ("digits_avg.yaml",),
}


def teachers(run_dir: Path) -> list[tuple[float, float]]:
    rows = [json.loads(line) for line in (only_run(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [(r["teacher/acc"], r["teacher/nll"]) for r in rows]


def assert_same_teacher(argv: list[str], tmp_path: Path) -> list[dict]:
    assert main(["fit", *argv, "--logger.run_dir", str(tmp_path / "plain")]) == 0
    assert main(["fit", *argv, *MASKED, "--logger.run_dir", str(tmp_path / "masked")]) == 0
    plain, masked = teachers(tmp_path / "plain"), teachers(tmp_path / "masked")
    assert len(plain) == len(masked) >= 2
    for (acc_p, nll_p), (acc_m, nll_m) in zip(plain, masked, strict=True):
        assert acc_m == pytest.approx(acc_p, abs=1e-6) and nll_m == pytest.approx(nll_p, abs=1e-6)
    return [json.loads(line) for line in (only_run(tmp_path / "masked") / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_masked_and_plain_runs_give_the_same_teacher_every_round_on_digits(rule, tmp_path):
    config, *flags = RULES[rule]
    rows = assert_same_teacher(tiny(config, tmp_path, *flags, rounds=3), tmp_path)
    assert all(r["secagg/failed"] == 0 for r in rows)
    if rule != "avg":  # the per-sample shift: its own masked exchange before the terms
        assert all(r["secagg/extra_exchanges"] == 6 and r["comm/down/secagg_shift"] > 0 for r in rows)


@pytest.mark.parametrize("rule", ["uwa", "suwa_4"])
def test_masked_and_plain_runs_give_the_same_teacher_every_round_on_fashion_mnist_idx_files(rule, tmp_path):
    folder = tmp_path / "fashion-idx"
    folder.mkdir()
    idx_folder(folder, n_train=400, n_test=40)
    flags = {"uwa": ["--aggregator", "fdlit.methods.UncertaintyWeighted"],
             "suwa_4": ["--aggregator.tau", "4"]}[rule]
    argv = ["--config", "fashion_mnist.yaml", *flags, "--data.data_dir", str(folder), "--logger.mode", "disabled",
            "--logger.progress", "false", "--federation.rounds", "2", "--federation.private_epochs_first", "1",
            "--federation.private_epochs", "1", "--federation.public_epochs_first", "1",
            "--federation.public_epochs", "1", "--data.num_clients", "4", "--data.classes_per_client", "5",
            "--data.samples_per_client", "40", "--data.public_size", "60", "--data.validation_size", "30",
            "--federation.eval_subsample", "null"]
    assert_same_teacher(argv, tmp_path)
