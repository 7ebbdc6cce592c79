"""A plain install (`make run`: torch, then `pip install -e .`) runs digits; every feature beyond it names
its pip extra in one line when the extra is missing. The extras are hidden from a fresh interpreter by an
import hook, so the check holds on a machine that has them all (the test machine)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTRA_MODULES = ("matplotlib", "scipy", "opacus", "opt_einsum", "cryptography", "ray", "flwr", "transformers",
                 "datasets", "huggingface_hub", "playwright", "pytest")
HIDE = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRA_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Absent())
for name in {EXTRA_MODULES!r}:
    sys.modules.pop(name, None)
sys.modules.update({{name: None for name in ("opacus", "cryptography", "matplotlib", "scipy")}})  # find_spec: None
import importlib.metadata as metadata  # nor their distributions (lightning_utilities asks for those)
found = metadata.distribution
def distribution(name):
    if name.lower().replace("-", "_") in {EXTRA_MODULES!r}:
        raise metadata.PackageNotFoundError(name)
    return found(name)
metadata.distribution = distribution
from fdlit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def fdlit_without_extras(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", HIDE, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def tiny(config: str, tmp_path: Path) -> list[str]:
    return ["--config", config, "--logger.progress", "false", "--logger.run_dir", str(tmp_path / "runs"),
            "--federation.rounds", "1", "--data.num_clients", "4", "--data.classes_per_client", "3",
            "--data.public_size", "120", "--federation.private_epochs_first", "1",
            "--federation.public_epochs_first", "1"]


def test_a_digits_run_with_wandb_needs_no_extra(tmp_path):
    out = fdlit_without_extras(tmp_path, "fit", *tiny("digits.yaml", tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fdlit summary" in out.stdout and list((tmp_path / "runs").glob("*/wandb/offline-run-*"))


@pytest.mark.parametrize(("config", "extra", "field"), [
    ("digits_dp.yaml", "privacy", "privacy.noise_multiplier"),
])
def test_a_feature_without_its_extra_is_refused_in_one_line_naming_it(config, extra, field, tmp_path):
    out = fdlit_without_extras(tmp_path, "fit", *tiny(config, tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert out.stderr.startswith(f"fdlit: error: {field}: needs ") and f".[{extra}]" in out.stderr
    assert not list((tmp_path / "runs").rglob("metrics.jsonl"))


def test_secure_aggregation_and_report_without_their_extras_are_refused_in_one_line(tmp_path):
    secure = fdlit_without_extras(tmp_path, "fit", *tiny("digits.yaml", tmp_path), "--privacy.secure_aggregation",
                                  "true")
    assert secure.returncode == 2 and secure.stderr.startswith("fdlit: error: privacy.secure_aggregation: needs "
                                                               "cryptography"), secure.stderr[-3000:]
    report = fdlit_without_extras(tmp_path, "report", str(tmp_path))
    assert report.returncode == 2 and report.stderr.count("\n") == 1, report.stderr[-3000:]
    assert report.stderr.startswith("fdlit: error: report: needs matplotlib") and ".[report]" in report.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_installs_the_core_and_make_test_the_test_extras(tmp_path):
    def pip_lines(target: str) -> list[str]:
        out = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
                             capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if "pip install" in line and "-e" in line.split()]
    assert [line.split()[-1] for line in pip_lines("run")] == ["."]
    assert [line.split()[-1] for line in pip_lines("test")] == [".", '".[test]"']
