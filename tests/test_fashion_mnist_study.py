"""configs/fashion_mnist.yaml, every method of sweeps/fashion_mnist_families.yaml and every run kind of
the every-rule sweeps (sweeps/fashion_mnist_every_rule*.yaml) run end to end on tiny IDX files in the real
format (4 clients, 1 round), with validation selection, so the studies cannot fail on a flag."""

from pathlib import Path

import paper_fixtures  # noqa: F401  (offline HF env first)
import pytest
from paper_fixtures import idx_folder

from fdlit.configuration.schema import parse_fit
from fdlit.runs.experiment import Experiment
from fdlit.sweeps.file import load_sweep

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = load_sweep(ROOT / "sweeps" / "fashion_mnist_families.yaml")


def every_rule_runs() -> dict[str, list[str]]:
    """Each kind of run of the every-rule study: its ``fit`` arguments as its sweep file gives them
    (the file's fixed arguments, then a ``config`` value where the file sweeps configs)."""
    runs = {}
    for path in sorted((ROOT / "sweeps").glob("fashion_mnist_every_rule*.yaml")):
        sweep = load_sweep(path)
        fixed = [a for a in sweep["_fit_tail"] if a != "${args}" and not a.startswith("--logger.run_dir")]
        configs = sweep["parameters"].get("config", {}).get("values", [None])
        for config in configs:
            runs[f"{path.stem}:{config or 'fixed'}"] = fixed + ([f"--config={config}"] if config else [])
    return runs


EVERY_RULE = every_rule_runs()

TINY = ["--logger.mode", "disabled", "--logger.progress", "false", "--federation.rounds", "1",
        "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
        "--data.num_clients", "4", "--data.samples_per_client", "20", "--data.public_size", "60",
        "--data.validation_size", "30", "--federation.eval_subsample", "null"]


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fashion-idx")
    idx_folder(folder, n_train=500, n_test=40)
    return folder


def test_config_is_the_documented_setting():
    _, cfg = parse_fit(["--config", "fashion_mnist.yaml"])
    d = cfg.data
    assert (d.dataset, d.num_clients, d.partition, d.classes_per_client) == ("fashion_mnist", 20, "classes", 2)
    assert d.validation_size > 0 and d.public_size >= 1000 and d.data_dir is None
    assert cfg.model.class_path == "fdlit.models.LeNet5"


def test_the_every_rule_study_is_the_thirteen_runs_its_table_documents():
    assert len(EVERY_RULE) == 13  # 10 configs and the three runs with their own settings
    assert sum(len(load_sweep(p)["parameters"]["seed"]["values"]) * 3
               for p in (ROOT / "sweeps").glob("fashion_mnist_every_rule*.yaml")
               for _ in load_sweep(p)["parameters"].get("config", {}).get("values", [None])) == 117


@pytest.mark.parametrize("run", sorted(EVERY_RULE))
def test_every_run_of_the_every_rule_study_runs_on_idx_files(run, fashion_dir, tmp_path):
    parser, cfg = parse_fit([*EVERY_RULE[run], "--data.data_dir", str(fashion_dir), "--data.classes_per_client",
                             "5", "--logger.run_dir", str(tmp_path), *TINY])
    summary = Experiment(cfg, parser).fit()
    assert summary["finished"]
    assert 0.0 <= summary["selected_global_acc_mean_after_private"] <= 1.0  # chosen by validation


@pytest.mark.parametrize("method", FAMILIES["parameters"]["config"]["values"])
def test_every_method_of_the_families_study_runs_on_idx_files_with_both_metrics(method, fashion_dir, tmp_path):
    tail = FAMILIES["_fit_tail"]
    base = tail[tail.index("--config") + 1]
    parser, cfg = parse_fit(["--config", base, f"--config={method}", "--data.data_dir", str(fashion_dir),
                             "--data.classes_per_client", "5", "--logger.run_dir", str(tmp_path), *TINY])
    summary = Experiment(cfg, parser).fit()
    assert summary["finished"]
    # the table's two metrics: the whole test set and each client's own classes
    assert 0.0 <= summary["selected_global_acc_mean"] <= 1.0
    assert 0.0 <= summary["final_local_acc_mean_after_public"] <= 1.0
