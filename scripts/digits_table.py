"""Reproduce the digits tables (README, docs/digits-results.md): AVG vs UWA vs sUWA at k=2 and k=9, 3 seeds.

    python scripts/digits_table.py --out runs/digits_table [--seeds 0 1 2] [--ks 2 9] [--jobs 2]

Each run is a normal ``fit`` (config ``configs/digits.yaml``) with W&B disabled; the table is built
from the runs' summary.json files: the best round's mean global accuracy (mean +- std over seeds),
measured after the private phase and after the public phase. Finished runs are reused on re-run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

AGGREGATORS = {
    "AVG": "fdlit.aggregators.ProbabilityAveragingAggregator",
    "UWA": "fdlit.aggregators.UncertaintyWeightedAggregator",
    "sUWA": "fdlit.aggregators.SmoothedUncertaintyWeightedAggregator",
}


def run_one(out: Path, name: str, k: int, seed: int, extra: list[str]) -> dict:
    run_dir = out / f"{name}-k{k}-seed{seed}"
    done = [p for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]
    if not done:
        cmd = [sys.executable, "-m", "fdlit", "fit", "--config", "configs/digits.yaml",
               "--aggregator", AGGREGATORS[name], "--data.classes_per_client", str(k), "--seed", str(seed),
               "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(run_dir), *extra]
        # one thread per run: parallel runs of these small models oversubscribe 2 cores otherwise
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        done = list(run_dir.glob("*/summary.json"))
    return json.loads(done[0].read_text())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("runs/digits_table"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ks", type=int, nargs="+", default=[2, 9])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--budgets", type=int, nargs="*", default=[5, 10],
                   help="also report the best after-public accuracy within the first R rounds (a run's first R "
                        "rounds are exactly an R-round run: no schedule depends on the total)")
    p.add_argument("extra", nargs="*", help="extra fit flags, after --")
    a = p.parse_args()
    grid = list(itertools.product(AGGREGATORS, a.ks, a.seeds))
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda g: run_one(a.out, *g, a.extra), grid))
    metrics = {"after private phase": "best_global_acc_mean_after_private", "after public phase": "best_global_acc_mean"}
    print("| method | " + " | ".join(f"k={k}, {phase}" for k in a.ks for phase in metrics) + " |")
    print("|---|" + "---|" * (len(a.ks) * len(metrics)))
    for name in AGGREGATORS:
        cells = []
        for k in a.ks:
            for key in metrics.values():
                v = [100 * s[key] for (n, kk, _), s in zip(grid, results) if n == name and kk == k]
                cells.append(f"{statistics.mean(v):.2f} ± {statistics.stdev(v) if len(v) > 1 else 0:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if not a.budgets:
        return
    print()
    print("Best mean global accuracy after the public phase within the first R rounds:")
    print("| method | " + " | ".join(f"k={k}, R={r}" for k in a.ks for r in a.budgets) + " |")
    print("|---|" + "---|" * (len(a.ks) * len(a.budgets)))
    for name in AGGREGATORS:
        cells = []
        for k in a.ks:
            for budget in a.budgets:
                v = [100 * best_within(s["run_dir"], budget) for (n, kk, _), s in zip(grid, results)
                     if n == name and kk == k]
                cells.append(f"{statistics.mean(v):.2f} ± {statistics.stdev(v) if len(v) > 1 else 0:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def best_within(run_dir: str, budget: int) -> float:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    # rounds that were not evaluated (federation.eval_every_n_rounds) have null accuracies
    return max(r["after_public/global_acc_mean"] for r in rows
               if r["round"] <= budget and r["after_public/global_acc_mean"] is not None)


if __name__ == "__main__":
    main()
