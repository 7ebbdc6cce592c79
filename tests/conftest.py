import os
import warnings

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one worker per core (make test): one BLAS/OpenMP thread each, inherited by the processes a test
    # starts, instead of every worker's threads competing for every core
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
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


def pytest_collection_modifyitems(config, items):
    """Marks the tests that start a local Ray as one xdist group. It does not take effect: xdist's worker
    reads the marker in its own hook, which runs before this one, so they run on both workers, two local
    Rays at once, which works (docs/testing.md)."""
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()) or "ray" in item.nodeid.lower().replace("array", ""):
            item.add_marker(pytest.mark.xdist_group("ray"))
