"""The study table of docs/heterogeneous.md from a folder of runs (sweeps/fashion_mnist_heterogeneous*.yaml):
one row per method as ``fdlit report`` labels it (without the settings that tell
the partitions and model groups apart) and one column block per partition (k classes per client, or
``dir<alpha>`` for a Dirichlet split), over its finished runs (an unfinished run has no final numbers), mean ± std over seeds of

* the final round's mean global test accuracy (``final_global_acc_mean``: after the public phase, which for
  the methods without one is after the round),
* the final round's mean local (personalized) accuracy, each client on the test rows of its own classes
  (``final_local_acc_mean_after_public``),
* the bytes one client sent and received over the run (``bytes_up_total`` and ``bytes_down_total`` over
  ``data.num_clients``), in MB (10^6 bytes).

With ``--by-network``: instead, per partition, each method's final global accuracy (%) of the clients on each
network of the ``PerClient`` group (a pair's private network for FML and FedKD), mean over seeds and clients.

    python scripts/heterogeneous_study_table.py runs/fashion_mnist_heterogeneous_small [--by-network]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fdlit.models.hetero import PerClient
from fdlit.reporting.labels import method_label
from fdlit.reporting.runs import load_runs


def run_numbers(summary: dict, num_clients: int) -> dict:
    """Global and local accuracy (%) and MB up / down per client of one finished run's summary."""
    return {"global": 100 * summary["final_global_acc_mean"],
            "local": 100 * summary["final_local_acc_mean_after_public"],
            "up": summary["bytes_up_total"] / num_clients / 1e6,
            "down": summary["bytes_down_total"] / num_clients / 1e6}


def mean_std(values: list[float], digits: int) -> str:
    """``mean ± std`` (sample std over seeds), or the mean alone for one value."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def partition_name(k) -> str:
    return f"Dirichlet α = {k[3:]}" if isinstance(k, str) and k.startswith("dir") else f"k = {k}"


def table(root: Path) -> str:
    """One markdown table per partition (k ascending, then the Dirichlet splits); the rows in the order
    the runs were started (a sweep's order of its methods)."""
    cells: dict[tuple, dict[str, list[dict]]] = {}
    runs, _ = load_runs([root])
    for run in sorted(runs, key=lambda r: r.path.name):  # run folders begin with their start time
        clients = int((run.config.get("data") or {}).get("num_clients") or 1)
        key = (1, 0, run.k) if isinstance(run.k, str) else (0, run.k, "")
        cells.setdefault(key, {}).setdefault(method_label(run.config), []).append(run_numbers(run.summary, clients))
    out = []
    for key in sorted(cells):
        out += [f"{partition_name(key[2] if key[0] else key[1])}:", "",
                "| method | seeds | final global accuracy (%) | final local accuracy (%) | MB per client up / down |",
                "|---|---|---|---|---|"]
        for method, numbers in cells[key].items():
            out.append(f"| {method} | {len(numbers)} | {mean_std([n['global'] for n in numbers], 1)} "
                       f"| {mean_std([n['local'] for n in numbers], 1)} "
                       f"| {_mb(numbers, 'up')} / {_mb(numbers, 'down')} |")
        out.append("")
    return "\n".join(out).rstrip("\n")


def client_networks(config: dict) -> list[str]:
    """Each client's network, in client order, by its class name (a ``MutualPair``: its private network's)."""
    model, clients = config.get("model") or {}, int((config.get("data") or {}).get("num_clients") or 1)
    groups = (model.get("init_args") or {}).get("groups")
    specs = PerClient.assign(groups, clients) if str(model.get("class_path", "")).endswith("PerClient") else [model] * clients
    names = []
    for spec in specs:
        private = (spec.get("init_args") or {}).get("private") if spec.get("class_path", "").endswith("MutualPair") else None
        names.append(str((private or spec).get("class_path", "?")).rsplit(".", 1)[-1])
    return names


def network_table(root: Path) -> str:
    """Per partition, a method's clients' final global accuracy (%) on each network, mean over seeds and clients."""
    cells: dict[tuple, dict[str, dict[str, list[float]]]] = {}
    networks: list[str] = []
    runs, _ = load_runs([root])
    for run in sorted(runs, key=lambda r: r.path.name):
        accs = next((m["clients/after_public/global_acc"] for m in reversed(run.metrics)
                     if isinstance(m.get("clients/after_public/global_acc"), list)), None)
        if accs is None:
            continue
        key = (1, 0, run.k) if isinstance(run.k, str) else (0, run.k, "")
        row = cells.setdefault(key, {}).setdefault(method_label(run.config), {})
        for name, acc in zip(client_networks(run.config), accs, strict=True):
            networks += [name] if name not in networks else []
            row.setdefault(name, []).append(100 * acc)
    out = []
    for key in sorted(cells):
        out += [f"{partition_name(key[2] if key[0] else key[1])}:", "", "| method | " + " | ".join(networks) + " |",
                "|---|" + "---|" * len(networks)]
        for method, row in cells[key].items():
            out.append(f"| {method} | " + " | ".join(f"{statistics.mean(row[n]):.1f}" if n in row else "–"
                                                      for n in networks) + " |")
        out.append("")
    return "\n".join(out).rstrip("\n")


def _mb(numbers: list[dict], which: str) -> str:
    values = [n[which] for n in numbers]
    digits = 3 if max(values) < 10 else 1
    spread = mean_std(values, digits)
    return spread.split(" ± ")[0] if spread.endswith(f" ± {0:.{digits}f}") else spread  # no spread at this precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="folder of run directories (a sweep's runs/<name>)")
    parser.add_argument("--by-network", action="store_true", help="the final global accuracy of each network's "
                        "clients instead")
    args = parser.parse_args()
    print(network_table(args.runs) if args.by_network else table(args.runs))


if __name__ == "__main__":
    main()
