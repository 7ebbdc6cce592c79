import os
import warnings

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")


@pytest.fixture
def fast_args(tmp_path):
    """CLI flags for a tiny, fast digits run writing into tmp_path."""
    return [
        "--config", "digits.yaml",
        "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path / "runs"),
        "--federation.rounds", "2", "--federation.private_epochs_first", "2", "--federation.private_epochs", "1",
        "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
        "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "200",
    ]


@pytest.fixture(scope="module")
def ray_local():
    """A local 2-CPU Ray for one test module (RayExecutor uses an initialised Ray as it is)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
