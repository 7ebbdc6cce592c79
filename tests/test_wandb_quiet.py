"""W&B is quiet in fdlit's console by default (its own settings: ``silent``, not output filtering): one
line per run says where it logs; ``--logger.verbose true`` gives W&B's full output back."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fit_offline(tmp_path: Path, *extra: str) -> list[str]:
    """The console lines (stdout and stderr) of a two-round offline digits run through the CLI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}  # W&B as a user has it
    env.update(PYTHONPATH=str(ROOT), WANDB_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "fdlit", "fit", "--config", "digits.yaml", "--logger.mode", "offline",
                          "--logger.progress", "false", "--logger.run_dir", str(tmp_path / "runs"),
                          "--federation.rounds", "2", "--data.num_clients", "4", "--data.classes_per_client", "3",
                          "--data.public_size", "120", *extra], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return (out.stdout + out.stderr).splitlines()


def test_by_default_one_line_says_where_wandb_logs_and_wandb_prints_nothing(tmp_path):
    lines = fit_offline(tmp_path)
    where = [line for line in lines if line.startswith("fdlit: W&B logs this run")]
    (folder,) = list((tmp_path / "runs").glob("*/wandb/offline-run-*"))
    assert where == [f"fdlit: W&B logs this run offline in {folder} (--logger.verbose true: W&B's own output)"]
    assert not [line for line in lines if line.startswith("wandb:")]
    assert any(line.startswith("fdlit summary:") for line in lines)


def test_verbose_gives_wandbs_own_output(tmp_path):
    lines = fit_offline(tmp_path, "--logger.verbose", "true")
    assert any(line.startswith("wandb: Tracking run with wandb version") for line in lines)
    assert any(line.startswith("wandb: Run summary:") for line in lines)
    assert not [line for line in lines if line.startswith("fdlit: W&B logs this run")]
