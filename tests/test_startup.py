"""`fdlit fit --help` stays light: it imports none of the heavy training-time packages (Lightning
pulls torch._dynamo and torchmetrics, which pull transformers and scipy). Checked by module, in a
fresh interpreter; the CPU-time ratio to `import torch` is measured by benchmarks/startup.py."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("lightning", "torch._dynamo", "torchmetrics", "transformers", "matplotlib", "scipy", "wandb", "ray",
         "sklearn", "pandas")
PROBE = """
import runpy, sys
sys.argv = ["fdlit", *sys.argv[1:]]
try:
    runpy.run_module("fdlit", run_name="__main__")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print("LOADED=" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def _loaded(*args: str) -> tuple[list[str], str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("LOADED=")][-1]
    return [m for m in line[len("LOADED="):].split(",") if m], out.stdout


@pytest.mark.parametrize("args", [("fit", "--help"), ("fit", "--config", "configs/digits.yaml", "--help")])
def test_fit_help_imports_no_heavy_package(args):
    loaded, text = _loaded(*args)
    assert "--aggregator" in text  # the help was printed, not an error
    assert loaded == [], f"`fdlit {' '.join(args)}` imported {loaded}"
