"""The benchmark scripts run end to end (tiny CPU settings; their numbers are not checked)."""

import re
import subprocess
import sys
from pathlib import Path

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
    CPU: both executors run, the vectorized one is really used, and they end at the same accuracy."""
    out = run("cifar10_gpu.py", "--device", "cpu", "--model", "SmallCNN", "--clients", "5", "--samples", "16",
              "--public", "16", "--train_size", "200", "--test_size", "50", "--rounds", "2", "--batch_size", "8",
              "--epochs", "1", "--run_dir", str(tmp_path))
    rows = table_rows(out)
    assert [r[0] for r in rows] == ["sequential (SequentialExecutor)", "vectorized (VectorizedExecutor)"]
    assert rows[0][-1] == rows[1][-1]  # final accuracy
    assert "synthetic" in out


def test_executors_benchmark_prints_both_ratios(tmp_path):
    out = run("executors.py", "--clients", "5", "--executors", "sequential", "sequential-fused", "vectorized",
              "--rounds", "2", "--repeats", "1", "--run_dir", str(tmp_path))
    rows = table_rows(out)
    assert [r[1] for r in rows] == ["sequential", "sequential-fused", "vectorized"]
    assert rows[0][4].startswith("1.00x") and re.search(r"\(1\.00x\)", rows[1][4])
