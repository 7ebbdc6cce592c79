"""Reproduce the digits tables (README, docs/digits-results.md): the aggregation rules at k=2 and k=9, 3 seeds.

    python scripts/digits_table.py --out runs/digits_table [--seeds 0 1 2] [--ks 2 9] [--jobs 2]
        [--rules AVG UWA sUWA] [--validation_size 100]

Each run is a normal ``fit`` of the rule's digits config (20 clients, MLP, 20 rounds) with W&B
disabled; the table is built from the runs' summary.json files, mean +- std over seeds, measured
after the private phase and after the public phase. With ``--validation_size N`` (N > 0) every run
keeps N private-pool samples as a validation set and the table reports the *validation-selected*
accuracy: the mean global test accuracy at the round with the best mean validation accuracy
(``selected_global_acc_mean*``), so no number is chosen on the test set. With ``--validation_size 0``
it reports the best round's test accuracy (test-best), as the README's first table. Finished runs
are reused on re-run.
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

# rule -> (config, extra fit flags); AVG / UWA / sUWA share configs/digits.yaml and differ in the aggregator
RULES = {
    "AVG": ("configs/digits.yaml", ["--aggregator", "fdlit.methods.ProbabilityAveraging"]),
    "UWA": ("configs/digits.yaml", ["--aggregator", "fdlit.methods.UncertaintyWeighted"]),
    "sUWA": ("configs/digits.yaml", ["--aggregator", "fdlit.methods.SmoothedUncertaintyWeighted"]),
    "UWA (logit mixing)": ("configs/digits_uwa_logits.yaml", []),
    "MM": ("configs/digits_meta_model.yaml", []),
    "LKD": ("configs/digits_lkd.yaml", []),
    "Selective-FD": ("configs/digits_selective_fd.yaml", []),
    "Selective-FD (features)": ("configs/digits_selective_fd_features.yaml", []),
    "F2L": ("configs/digits_f2l.yaml", []),
    "F2L (as published)": ("configs/digits_f2l_fedavg.yaml", []),
}
DEFAULT_RULES = ["AVG", "UWA", "sUWA"]


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")


def run_one(out: Path, name: str, k: int, seed: int, validation_size: int, extra: list[str], rules=RULES) -> dict:
    run_dir = out / (f"{slug(name)}-k{k}-seed{seed}" + (f"-val{validation_size}" if validation_size else ""))
    def finished() -> list[Path]:  # an interrupted earlier attempt leaves an unfinished summary beside it
        return [p for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]

    done = finished()
    if not done:
        config, flags = rules[name]
        cmd = [sys.executable, "-m", "fdlit", "fit", "--config", config, *flags,
               "--data.classes_per_client", str(k), "--seed", str(seed),
               "--data.validation_size", str(validation_size),
               "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(run_dir), *extra]
        # one thread per run: parallel runs of these small models oversubscribe 2 cores otherwise
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        done = finished()
    return json.loads(done[0].read_text())


def cell(values: list[float]) -> str:
    """mean ± sample std over seeds; one seed has no std (never a made-up ``± 0.00``)."""
    if not values:  # a baseline without this phase (local-only, the centralized reference)
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def run_all(grid: list[tuple], run, jobs: int, say=None) -> list[dict]:
    """``run(*cell)`` for every cell of the grid, ``jobs`` at once, in grid order; one progress line
    per finished run on stderr (which run, how long, how many are left)."""
    import time
    from concurrent.futures import as_completed

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    say(f"digits_table: {len(grid)} runs, {jobs} at once (finished runs in the output folder are reused)")
    start, results = time.perf_counter(), [None] * len(grid)
    with ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(run, *cell_): i for i, cell_ in enumerate(grid)}
        for done, future in enumerate(as_completed(futures), 1):
            i = futures[future]
            results[i] = future.result()
            name, k, seed = grid[i]
            say(f"digits_table: [{done}/{len(grid)}] {name} k={k} seed={seed} done "
                f"({results[i].get('wall_time_s', 0):.0f} s of training; {time.perf_counter() - start:.0f} s so far)")
    return results


def main(rules=RULES, default_rules=DEFAULT_RULES, out="runs/digits_table", ks=(2, 9), validation_size=0,
         doc=None) -> None:
    """The table for ``rules`` (name -> (config, fit flags)); the defaults are the digits study's."""
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--out", type=Path, default=Path(out))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ks", type=int, nargs="+", default=list(ks))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--rules", nargs="+", default=default_rules, choices=list(rules),
                   help=f"rules to run (default: {' '.join(default_rules)})")
    p.add_argument("--validation_size", type=int, default=validation_size,
                   help="validation samples per run (data.validation_size); > 0 reports validation-selected accuracy")
    p.add_argument("--budgets", type=int, nargs="*", default=[5, 10],
                   help="also report the best after-public accuracy within the first R rounds (a run's first R "
                        "rounds are exactly an R-round run: no schedule depends on the total)")
    p.add_argument("extra", nargs="*", help="extra fit flags, after --")
    a = p.parse_args()
    grid = list(itertools.product(a.rules, a.ks, a.seeds))
    results = run_all(grid, lambda *g: run_one(a.out, *g, a.validation_size, a.extra, rules), a.jobs)
    spread = f"mean ± std over {len(a.seeds)} seeds" if len(a.seeds) > 1 else "one seed, no std"
    if a.validation_size:
        print(f"Validation-selected mean global test accuracy (%, {spread}), {a.validation_size} validation samples:")
        metrics = {"after private phase": "selected_global_acc_mean_after_private",
                   "after public phase": "selected_global_acc_mean"}
    else:
        print(f"Best round's mean global test accuracy (%, {spread}):")
        metrics = {"after private phase": "best_global_acc_mean_after_private",
                   "after public phase": "best_global_acc_mean"}
    print("| method | " + " | ".join(f"k={k}, {phase}" for k in a.ks for phase in metrics) + " |")
    print("|---|" + "---|" * (len(a.ks) * len(metrics)))
    for name in a.rules:
        cells = []
        for k in a.ks:
            for key in metrics.values():
                cells.append(cell([100 * s[key] for (n, kk, _), s in zip(grid, results, strict=True)
                                   if n == name and kk == k and s.get(key) is not None]))
        print(f"| {name} | " + " | ".join(cells) + " |")
    times = [s["wall_time_s"] for s in results]
    print(f"\n{len(results)} runs, training wall time per run {statistics.mean(times):.1f} s "
          f"(min {min(times):.1f}, max {max(times):.1f})")
    if not a.budgets:
        return
    print()
    print("Best mean global accuracy after the public phase within the first R rounds:")
    print("| method | " + " | ".join(f"k={k}, R={r}" for k in a.ks for r in a.budgets) + " |")
    print("|---|" + "---|" * (len(a.ks) * len(a.budgets)))
    for name in a.rules:
        cells = []
        for k in a.ks:
            for budget in a.budgets:
                cells.append(cell([100 * best_within(s["run_dir"], budget) for (n, kk, _), s in zip(grid, results, strict=True)
                                   if n == name and kk == k]))
        print(f"| {name} | " + " | ".join(cells) + " |")


def best_within(run_dir: str, budget: int) -> float:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    # rounds that were not evaluated (federation.eval_every_n_rounds) have null accuracies
    return max(r["after_public/global_acc_mean"] for r in rows
               if r["round"] <= budget and r["after_public/global_acc_mean"] is not None)


if __name__ == "__main__":
    main()
