"""Secure aggregation's threshold is at least 2: a run that can never sample 2 clients is refused
before round 1, and a round in which fewer than t clients survive records it and the summary says so."""

from __future__ import annotations

import json

from fdlit.cli import main
from fdlit.privacy.secure_sum import threshold
from tests.fitting import only_run, tiny


def test_the_threshold_is_max_2_and_the_fraction_never_capped_at_the_clients():
    assert threshold(1, 0.5) == 2 and threshold(2, 0.5) == 2 and threshold(3, 1.0) == 3 and threshold(10, 0.5) == 5


def test_one_sampled_client_under_secure_aggregation_is_refused_in_one_line(tmp_path, capsys):
    argv = ["fit", *tiny("digits_avg.yaml", tmp_path, "--federation.participation.count", "1",
                         "--privacy.secure_aggregation", "true")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: privacy.secure_aggregation: needs at least 2 clients")
    assert "samples at most 1 a round" in err[0] and "federation.participation.count" in err[0]
    assert not list(tmp_path.iterdir())  # before any run directory


def test_a_round_with_too_few_survivors_records_why_and_the_summary_names_it(tmp_path, capsys):
    # 2 sampled, most of them dropping: rounds with one survivor cannot unmask (t = 2)
    argv = ["fit", *tiny("digits_avg.yaml", tmp_path, "--federation.participation.count", "2",
                         "--federation.participation.dropout", "0.6", "--privacy.secure_aggregation", "true",
                         rounds=4)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in (only_run(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r.get("secagg/failed") == 1]
    assert failed, "the seed gives a round with one survivor"
    for r in failed:
        assert r["secagg/survivors"] < r["secagg/threshold"] == 2 and r["teacher/acc"] is None  # no teacher
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["secagg_failed_rounds"] == len(failed)
    assert f"secure aggregation        : failed in {len(failed)} round(s)" in out
    assert "this run sends no predictions" not in out
