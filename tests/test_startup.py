"""`fdlit fit --help` stays light: it imports none of the heavy training-time packages (Lightning
pulls torch._dynamo and torchmetrics, which pull transformers and scipy). Checked by module, in a
fresh interpreter; the CPU-time ratio to `import torch` is measured by benchmarks/startup.py."""

import os
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


# what a digits run may import besides the standard library: torch, Lightning (clients are
# LightningModules) with what Lightning itself needs, the config machinery, and W&B's client with its
# own dependencies when W&B is on. A new package here is a start-up cost: add it only on purpose.
RUN_PACKAGES = {
    "fdlit", "torch", "torchgen", "numpy", "opt_einsum", "lightning", "lightning_utilities", "torchmetrics",
    "fsspec", "packaging", "typing_extensions", "tqdm", "yaml", "jsonargparse", "docstring_parser",
    "typeshed_client", "attr", "attrs", "dill", "regex", "rich", "PIL", "cython_runtime", "markdown_it", "mdurl",
    "pygments", "importlib_metadata", "zipp", "filelock",
    # torchmetrics' plot helpers import matplotlib where it is installed, so a metric's plot works in the process
    "matplotlib", "mpl_toolkits", "cycler", "dateutil", "fontTools", "kiwisolver", "pyparsing", "six",
}
WANDB_PACKAGES = {"wandb", "annotated_types", "click", "google", "opentelemetry", "platformdirs", "pydantic",
                  "pydantic_core", "typing_inspection", "xxhash", "requests", "urllib3", "idna", "charset_normalizer",
                  "certifi", "sentry_sdk", "psutil", "gitdb", "git", "smmap", "setproctitle", "protobuf"}
NEVER_IN_A_DIGITS_RUN = ("transformers", "scipy", "sympy", "sklearn", "pandas", "torch._dynamo",
                         "datasets", "ray", "flwr", "torchvision")
RUN_PROBE = f"""
import runpy, sys
sys.argv = ["fdlit", *sys.argv[1:]]
try:
    runpy.run_module("fdlit", run_name="__main__")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
tops = {{m.split(".")[0] for m in sys.modules if not m.startswith("_")}} - set(sys.stdlib_module_names)
print("TOPS=" + ",".join(sorted(tops)))
print("LOADED=" + ",".join(m for m in {NEVER_IN_A_DIGITS_RUN!r} if m in sys.modules))
"""


@pytest.mark.parametrize("wandb_mode", ["disabled", "offline"])
def test_a_digits_fit_imports_only_what_it_uses(tmp_path, wandb_mode):
    """A whole `fdlit fit` on digits (one round) through the real entry point: nothing of transformers,
    SciPy, SymPy or torch._dynamo, and no package outside the list above."""
    out = subprocess.run([sys.executable, "-c", RUN_PROBE, "fit", "--config", "configs/digits.yaml",
                          "--federation.rounds", "1", "--logger.mode", wandb_mode, "--logger.progress", "false",
                          "--logger.run_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "WANDB_MODE": wandb_mode, "WANDB_SILENT": "true"})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    loaded = [m for m in lines[-1][len("LOADED="):].split(",") if m]
    tops = {m for m in lines[-2][len("TOPS="):].split(",") if m}
    assert loaded == [], f"a digits fit imported {loaded}"
    assert "lightning" in tops and "torch" in tops  # the clients are LightningModules
    allowed = RUN_PACKAGES | (WANDB_PACKAGES if wandb_mode == "offline" else set())
    assert tops <= allowed, f"a digits fit (W&B {wandb_mode}) imported packages beyond the list: {sorted(tops - allowed)}"


REFUSALS = {
    "deploy argument": ["deploy", "--config", "configs/digits.yaml", "--threads", "-3"],
    "export of no run": ["export", "no/such/run", "--out", "m.pt"],
    "report of no folder": ["report", "no/such/folder"],
    "sweep of no file": ["sweep", "no/such/sweep.yaml"],
    "fit knob": ["fit", "--config", "configs/digits.yaml", "--data.num_clients", "0"],
    "fit dataset offline": ["fit", "--config", "configs/cifar10.yaml"],
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_are_decided_before_the_heavy_imports(tmp_path, case):
    """Each refusal through the real entry point: one line on stderr, exit 2, and none of the run's
    heavy imports (Lightning, torchmetrics, W&B, datasets, ...) paid for it."""
    heavy = ("lightning", "torchmetrics", "wandb", "datasets", "transformers", "matplotlib", "scipy", "torch._dynamo",
             "flwr", "ray")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "FDLIT_CACHE": str(tmp_path / "c")}
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=heavy, codes=(2,)), *REFUSALS[case]], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("fdlit")]
    assert len(errors) == 1 and ": error: " in errors[0], out.stderr[-2000:]
    loaded = [m for m in out.stdout.splitlines()[-1][len("LOADED="):].split(",") if m]
    assert loaded == [], f"refusing {case!r} imported {loaded}"


def test_digits_read_without_scikit_learn_equal_its_loader():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    from fdlit.data.datasets import load_digits

    ours = load_digits()
    bunch = sklearn_datasets.load_digits()
    assert ours.x.shape == (1797, 1, 8, 8)
    assert (ours.x.numpy() * 16.0 == bunch.images[:, None]).all()
    assert (ours.y.numpy() == bunch.target).all()
