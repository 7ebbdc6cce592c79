"""The benchmark scripts run end to end (tiny CPU settings; their numbers are not checked)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| M |") and not line.startswith("| executor")]


def test_cifar10_gpu_benchmark_runs_on_cpu_with_the_image_pipeline(tmp_path):
    """The GPU benchmark's code path (synthetic CIFAR-10-shaped uint8 data, ImageInput, sUWA) on a
    CPU: both executors run, the vectorized one is really used (as the grouped network), and they end
    at the same accuracy."""
    out = run("cifar10_gpu.py", "--device", "cpu", "--model", "SmallCNN", "--clients", "5", "--samples", "16",
              "--public", "16", "--train_size", "200", "--test_size", "50", "--rounds", "2", "--batch_size", "8",
              "--epochs", "1", "--run_dir", str(tmp_path), "--profile")
    rows = table_rows(out)
    assert [r[0] for r in rows] == ["sequential (SequentialExecutor)", "vectorized (VectorizedExecutor, grouped)"]
    assert rows[0][-1] == rows[1][-1]  # final accuracy
    assert "synthetic" in out
    profiles = sorted(p.name for p in tmp_path.glob("profile-*.txt"))  # round 2 of each executor
    assert profiles == ["profile-sequential-5.txt", "profile-vectorized-5.txt"]
    assert out.count("kernel time by op over round 2") == 2 and "aten::" in (tmp_path / profiles[-1]).read_text()


def test_executors_benchmark_prints_both_ratios(tmp_path):
    out = run("executors.py", "--clients", "5", "--executors", "sequential", "sequential-fused", "vectorized",
              "--rounds", "2", "--repeats", "1", "--run_dir", str(tmp_path))
    rows = table_rows(out)
    assert [r[1] for r in rows] == ["sequential", "sequential-fused", "vectorized"]
    assert rows[0][4].startswith("1.00x") and re.search(r"\(1\.00x\)", rows[1][4])


def test_scale_benchmark_times_every_component(tmp_path):
    """On Fashion-MNIST's IDX format (tiny files), with the benchmark's own test subset."""
    from paper_fixtures import idx_folder

    idx_folder(tmp_path / "fashion", n_train=500, n_test=40)
    out = run("scale.py", "--clients", "5", "--rounds", "2", "--run_dir", str(tmp_path), "--test_samples", "20",
              "--data.data_dir", str(tmp_path / "fashion"), "--data.samples_per_client", "10",
              "--data.public_size", "40")
    (row,) = table_rows(out)
    assert row[0] == "5"
    assert "fashion_mnist.yaml" in out and "20 test samples" in out
    round_s, parts = float(row[1]), [float(v) for v in row[2:9]]  # train ... other
    assert all(v >= 0 for v in parts[:-1]) and parts[0] > 0 and parts[5] > 0  # train and checkpoint measured
    assert sum(parts) == pytest.approx(round_s, abs=0.02)  # "other" is the rest of the round
    assert row[9].endswith("%") and float(row[10]) > 0 and float(row[11]) > 0 and float(row[12]) > 0  # write, MiB, RSS


def test_density_benchmark_reports_speed_up_and_tolerance():
    out = run("density.py", "--clients", "2", "--public", "50", "--components", "3", "--classes", "10",
              "--repeats", "1")
    direct, matmul = [r for r in table_rows(out) if r[0] != "form"]
    assert direct[0] == "direct" and matmul[0] == "matmul" and matmul[2].endswith("x")
    assert float(matmul[3]) <= 1e-9 and matmul[4] == "True"


def test_machine_limit_measures_each_part_of_a_run():
    """The per-run measurement of ``machine_limit.py`` (the child it starts per workload): training,
    evaluation and inference each timed and counted in FLOPs through the executor of a real run."""
    import json

    out = json.loads(run("machine_limit.py", "--child", "digits", "--rounds", "1").strip().splitlines()[-1])
    assert set(out["cpu"]) == set(out["flops"]) == {"train", "evaluation", "inference"}
    assert all(out["cpu"][k] > 0 and out["flops"][k] > 0 for k in out["cpu"])
