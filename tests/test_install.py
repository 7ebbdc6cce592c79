"""`make install` picks the torch build for the machine: CPU wheels without an NVIDIA GPU, the default
(CUDA) index with one, and TORCH / TORCH_INDEX override the choice. Checked with `make -n` (nothing
is installed) and a fake `nvidia-smi` on PATH."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _pip_line(tmp_path: Path, gpu: bool | None, *overrides: str) -> str:
    """The torch install line `make -n install` would run, with PATH holding only a fake nvidia-smi
    (answering like a GPU machine, or failing like a driver without a GPU) or none at all."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpu is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3'\nexit 0\n" if gpu else
                        "#!/bin/sh\necho 'NVIDIA-SMI has failed: no devices were found' >&2\nexit 9\n")
        fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    env.pop("TORCH_INDEX", None)
    env.pop("TORCH", None)
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "install", f"VENV={tmp_path / 'venv'}", *overrides],
                         env=env, capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if "pip install" in line and "-e" not in line.split()]
    assert len(lines) == 1, out
    return lines[0]


def test_no_nvidia_smi_installs_cpu_torch(tmp_path):
    line = _pip_line(tmp_path, gpu=None)
    assert "torch==" in line and f"--extra-index-url {CPU_INDEX}" in line


def test_nvidia_smi_without_a_gpu_still_installs_cpu_torch(tmp_path):
    assert f"--extra-index-url {CPU_INDEX}" in _pip_line(tmp_path, gpu=False)


def test_a_gpu_gets_the_default_cuda_index(tmp_path):
    line = _pip_line(tmp_path, gpu=True)
    assert "torch==" in line and "index-url" not in line


def test_torch_and_index_are_overridable(tmp_path):
    line = _pip_line(tmp_path, True, "TORCH=torch==2.5.1", "TORCH_INDEX=https://download.pytorch.org/whl/cu121")
    assert "torch==2.5.1 --extra-index-url https://download.pytorch.org/whl/cu121" in line
    assert "index-url" not in _pip_line(tmp_path, False, "TORCH_INDEX=")


def test_install_says_how_to_get_fashion_mnist_only_when_it_is_missing(tmp_path):
    def hint(folder: Path) -> str:
        return subprocess.run(["make", "-s", "-C", str(ROOT), "data-hint", f"FASHION_MNIST_DIR={folder}"],
                              capture_output=True, text=True, check=True).stdout
    assert "apt-get install dataset-fashion-mnist" in hint(tmp_path / "absent")
    assert "--data.data_dir" in hint(tmp_path / "absent")
    assert hint(tmp_path) == ""
