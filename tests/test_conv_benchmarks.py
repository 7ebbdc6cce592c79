"""The executor CPU and stacked-convolution benchmarks run end to end (tiny CPU settings; their
numbers are not checked, only their tables)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_DIGITS = ["--config", "digits.yaml", "--model", "fdlit.models.SmallCNN", "--federation.rounds", "1",
               "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
               "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "50"]


def run(script: str, *args: str) -> list[list[str]]:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith(("| variant", "| work"))]


def test_executor_cpu_compares_interleaved_runs():
    rows = run("executor_cpu.py", "--pairs", "1", "--variants", "sequential", "vectorized-vmap", *TINY_DIGITS)
    assert [r[0] for r in rows] == ["sequential", "vectorized-vmap"]
    assert rows[0][2] == "1.00" and all(float(r[1]) > 0 for r in rows)
    assert all(r[4] != "?" for r in rows)  # each run's accuracy was read from its summary


def test_stacked_conv_times_every_form():
    rows = run("stacked_conv.py", "--clients", "2", "--batch", "4", "--repeats", "1", "--eval_samples", "8",
               "--eval_batch", "4")
    assert [r[1] for r in rows] == ["per-client loop", "vmap", "vmap, channels-last weights",
                                    "grouped, per-client convolutions", "grouped", "per-client loop", "vmap", "grouped"]
    assert rows[0][3] == "1.00" and rows[5][3] == "1.00"


def test_stacked_conv_times_batchnorm_and_residual_networks():
    for model, extra in (("convbn", []), ("resnet18", ["--image", "8"])):
        rows = run("stacked_conv.py", "--model", model, "--clients", "2", "--batch", "4", "--repeats", "1",
                   "--eval_samples", "8", "--eval_batch", "4", *extra)
        assert [r[1] for r in rows] == ["per-client loop", "vmap", "grouped"] * 2, model
        assert rows[0][3] == "1.00" and rows[3][3] == "1.00"
