"""scripts/heterogeneous_study_table.py on a tiny folder of written runs: one table per partition (k
ascending, then Dirichlet), a row per method in the order the runs started, mean ± sample std over seeds of
the final global and local accuracy (%), and bytes per client (total over data.num_clients, MB); an
unfinished run is left out; ``--by-network`` splits the clients' final global accuracy by their network in
the PerClient group (a MutualPair by its private network)."""

import importlib.util
import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("heterogeneous_study_table", REPO / "scripts" / "heterogeneous_study_table.py")
study = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study)


def write_run(root: Path, name: str, method: str, data: dict, seed: int, acc: float, local: float,
              up: int, finished: bool = True, model: dict | None = None, clients: list | None = None) -> None:
    run = root / name
    run.mkdir()
    config = {"seed": seed, "data": {"dataset": "fashion_mnist", "num_clients": 4, **data},
              "aggregator": {"class_path": method}, "federation": {"rounds": 2}, **({"model": model} if model else {})}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 2, "after_public/global_acc_mean": acc,
                                                              "clients/after_public/global_acc": clients or [acc] * 4}) + "\n")
    (run / "summary.json").write_text(json.dumps({
        "finished": finished, "final_global_acc_mean": acc, "final_local_acc_mean_after_public": local,
        "bytes_up_total": up, "bytes_down_total": 2 * up}))


def test_one_table_per_partition_with_mean_std_over_seeds(tmp_path):
    classes2 = {"partition": "classes", "classes_per_client": 2}
    dirichlet = {"partition": "dirichlet", "dirichlet_alpha": 0.1}
    write_run(tmp_path, "3-dir-fd-s0", "fdlit.methods.FedDistill", dirichlet, 0, 0.40, 0.80, 4_000_000)
    write_run(tmp_path, "1-k2-fd-s0", "fdlit.methods.FedDistill", classes2, 0, 0.20, 0.90, 4_000_000)
    write_run(tmp_path, "1-k2-fd-s1", "fdlit.methods.FedDistill", classes2, 1, 0.22, 0.94, 4_000_000)
    write_run(tmp_path, "0-k2-avg-s0", "fdlit.methods.ProbabilityAveraging", classes2, 0, 0.30, 0.70, 8_000_000)
    write_run(tmp_path, "0-k2-avg-s1", "fdlit.methods.ProbabilityAveraging", classes2, 1, 0.34, 0.74, 12_000_000)
    write_run(tmp_path, "2-k2-avg-s2", "fdlit.methods.ProbabilityAveraging", classes2, 2, 0.90, 0.90, 1, finished=False)
    lines = study.table(tmp_path).splitlines()
    k2, dirichlet_at = lines.index("k = 2:"), lines.index("Dirichlet α = 0.1:")
    assert k2 < dirichlet_at
    rows = [line for line in lines[k2:dirichlet_at] if line.startswith("| ") and "seeds" not in line]
    assert rows == ["| AVG | 2 | 32.0 ± 2.8 | 72.0 ± 2.8 | 2.500 ± 0.707 / 5.000 ± 1.414 |",
                    "| FD | 2 | 21.0 ± 1.4 | 92.0 ± 2.8 | 1.000 / 2.000 |"]
    assert lines[-1] == "| FD | 1 | 40.0 | 80.0 | 1.000 / 2.000 |"


def test_by_network_splits_the_clients_by_their_network(tmp_path):
    mlp, lenet = {"class_path": "fdlit.models.MLP"}, {"class_path": "fdlit.models.LeNet5"}
    mixed = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {**mlp, "fraction": 0.25}, {**lenet, "fraction": 0.75}]}}
    pairs = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {"class_path": "fdlit.models.mutual.MutualPair", "init_args": {"private": lenet, "shared": mlp}, "clients": [0, 1]},
        {"class_path": "fdlit.models.mutual.MutualPair", "init_args": {"private": mlp, "shared": mlp}, "fraction": 1}]}}
    classes2 = {"partition": "classes", "classes_per_client": 2}
    write_run(tmp_path, "0-s0", "fdlit.methods.FedDistill", classes2, 0, 0.3, 0.9, 1, model=mixed, clients=[0.1, 0.2, 0.3, 0.4])
    write_run(tmp_path, "1-s1", "fdlit.methods.FedDistill", classes2, 1, 0.3, 0.9, 1, model=mixed, clients=[0.3, 0.2, 0.2, 0.2])
    write_run(tmp_path, "2-s0", "fdlit.methods.FML", classes2, 0, 0.3, 0.9, 1, model=pairs, clients=[0.5, 0.7, 0.1, 0.3])
    assert study.network_table(tmp_path).splitlines() == [
        "k = 2:", "", "| method | MLP | LeNet5 |", "|---|---|---|",
        "| FD | 20.0 | 25.0 |", "| FML | 20.0 | 60.0 |"]
