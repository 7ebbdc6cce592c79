"""The CIFAR-10 GPU suite (benchmarks/cifar10_suite.py, ``cifar10_gpu.py --suite``) on a CPU: every
case's code path at toy size (the numbers mean nothing and are not checked), the fresh-process path
with its JSON lines, and how a case stopped at its time share is reported."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import cifar10_suite  # noqa: E402

HALVES = [[c.name for c in cifar10_suite.CASES[:5]], [c.name for c in cifar10_suite.CASES[5:]]]


@pytest.mark.parametrize("cases", HALVES, ids=["m20-cases", "m100-sweep-paper"])
def test_dry_run_runs_every_case_through_fit(cases, tmp_path, capsys, monkeypatch):
    """Every case finishes its rounds through ``fit`` of configs/cifar10.yaml: the grouped network,
    the static step where the case asks for CUDA graphs (and only there), the stacked sweep's 3 runs,
    the paper run's scaled estimate; one JSON line per case; the output says the data is synthetic."""
    from fdlit.data.datasets import DATASETS

    # the suite registers its synthetic set in this process: taken out again when the test ends
    monkeypatch.setitem(DATASETS, "cifar10-synthetic", None)
    out = tmp_path / "suite.jsonl"
    cifar10_suite.main(["--dry-run", "--out", str(out), "--run_dir", str(tmp_path / "runs"), "--cases", *cases])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["case"] for r in rows] == cases
    for r in rows:
        assert r["status"] == "finished" and r["forms"] == ["grouped"], r
        assert r["rounds_timed"] == (3 if r["case"] in ("paper",) else 2)
        assert r["s_per_round"] > 0 and r["tflops"] > 0 and r["device"] == "cpu"
        graphs = "--federation.cuda_graphs" in r["flags"]
        assert (r["static_client_phases"] > 0) == graphs, r["case"]
    by_name = {r["case"]: r for r in rows}
    printed = capsys.readouterr().out
    assert "synthetic" in printed and all(f"| {name} |" in printed for name in cases)
    if "m20-graphs-bf16w" in by_name:
        assert "bf16-true" in by_name["m20-graphs-bf16w"]["argv"]
    if "paper" in by_name:
        assert by_name["sweep-3x20"]["runs"] == 3
        paper = by_name["paper"]
        assert paper["full_run_estimate_s"] == pytest.approx(paper["fit_s"] + 47 * paper["s_per_round"])
        assert "50 rounds ≈" in printed


def test_suite_runs_cases_in_fresh_processes(tmp_path):
    out = tmp_path / "suite.jsonl"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cifar10_gpu.py"), "--suite", "--device", "cpu",
                           "--tiny", "--cases", "m20-graphs-adam", "--budget_s", "300", "--out", str(out),
                           "--run_dir", str(tmp_path / "runs")], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "finished" and row["rounds_timed"] == 2 and row["static_client_phases"] > 0
    assert "| m20-graphs-adam |" in proc.stdout


def test_a_case_stopped_at_its_share_reports_its_finished_rounds():
    opts = argparse.Namespace(data_dir=None, device="cuda", precision="bf16-mixed", run_dir="/tmp/x", tiny=False,
                              paper_flags="", peak_tflops=None)
    case = cifar10_suite.sized(next(c for c in cifar10_suite.CASES if c.name == "paper"), argparse.Namespace(
        paper_rounds=50, tiny=False))
    events = [{"event": "start", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.x", "flop": 2e15, "first_flop": 1e16},
              {"event": "round", "round": 1, "s": 100.0, "peak_gib": 20.0, "util": 90.0, "forms": ["grouped"],
               "executor": "VectorizedExecutor", "acc": 0.1, "static_client_phases": 0}]
    row = cifar10_suite.summarise(case, events, "stopped at its share (170 s)", opts, None)
    assert row["timed"] == "round 1 only" and row["s_per_round"] == 100.0
    assert row["tflops"] == pytest.approx(100.0) and row["pct_bf16_peak"] == pytest.approx(100 * 100 / 989)
    assert "full_run_estimate_s" not in row  # no whole run to scale
    assert "--data.dataset" in row["argv"] and "cifar10-synthetic" in row["argv"]


def test_without_cuda_the_suite_says_what_runs_on_a_cpu():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cifar10_gpu.py"), "--suite"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 1 and "no CUDA device (--dry-run" in proc.stderr
