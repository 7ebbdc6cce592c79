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
    assert exc.code in {codes!r}, exc.code
print("LOADED=" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def _loaded(*args: str, codes=(0, None)) -> tuple[list[str], str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, codes=codes), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("LOADED=")][-1]
    return [m for m in line[len("LOADED="):].split(",") if m], out.stdout


@pytest.mark.parametrize("args", [("fit", "--help"), ("fit", "--config", "configs/digits.yaml", "--help")])
def test_fit_help_imports_no_heavy_package(args):
    loaded, text = _loaded(*args)
    assert "--aggregator" in text  # the help was printed, not an error
    assert loaded == [], f"`fdlit {' '.join(args)}` imported {loaded}"


def test_config_error_imports_no_heavy_package():
    loaded, _ = _loaded("fit", "--config", "configs/digits.yaml", "--client.optimizer", "adagrad", codes=(2,))
    assert loaded == [], f"a config error imported {loaded}"


SETUP_PROBE = """
import sys
from fdlit.config import parse_fit
from fdlit.runs.experiment import Experiment
parser, cfg = parse_fit(["--config", "configs/digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
                         "--logger.run_dir", sys.argv[1], "--federation.rounds", "1"])
experiment = Experiment(cfg, parser)
experiment.setup()
assert experiment.loop.clients and experiment.loop.executor is not None
experiment.close()
print("LOADED=" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""
# a run imports Lightning (clients are LightningModules) and what Lightning itself imports; nothing
# heavy besides
RUN_HEAVY = ("lightning", "torch._dynamo", "torchmetrics", "transformers", "scipy", "sklearn", "pandas",
             "matplotlib", "ray", "wandb")
LIGHTNING_PROBE = """
import sys
import lightning.pytorch
print("LOADED=" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def _probe_loaded(probe: str, *args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", probe.format(heavy=RUN_HEAVY), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("LOADED=")][-1]
    return {m for m in line[len("LOADED="):].split(",") if m}


def test_cpu_float32_run_setup_imports_nothing_heavy_but_lightning(tmp_path):
    loaded = _probe_loaded(SETUP_PROBE, str(tmp_path))
    assert "lightning" in loaded  # the clients are LightningModules
    extra = loaded - _probe_loaded(LIGHTNING_PROBE)
    assert not extra, f"setting up a CPU float32 digits run imported {sorted(extra)} beyond Lightning's own imports"


def test_digits_read_without_scikit_learn_equal_its_loader():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    from fdlit.data.datasets import load_digits

    ours = load_digits()
    bunch = sklearn_datasets.load_digits()
    assert ours.x.shape == (1797, 1, 8, 8)
    assert (ours.x.numpy() * 16.0 == bunch.images[:, None]).all()
    assert (ours.y.numpy() == bunch.target).all()
