"""Every aggregation rule side by side on digits (issue 4): best mean global accuracy +- std over
seeds, and total bytes (up + down, mean over seeds), for k classes per client.

    python scripts/compare_aggregators.py --out runs/compare [--seeds 0 1 2] [--ks 1 2 3 5 9] \
        [--rules AVG sUWA ...] [--jobs 2] [-- --federation.rounds 6]

Each run is a normal ``fit`` of the rule's config under ``configs/`` with W&B disabled, one thread
per run; finished runs (their summary.json says ``finished``) are reused, so the script can be
re-run to fill in a grid. The table is printed as Markdown; ``--json`` also writes the raw numbers.
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

# rule name -> config (each config is configs/digits.yaml with its own aggregator block)
RULES = {
    "AVG": "configs/digits_avg.yaml",
    "Logit avg": "configs/digits_logit_averaging.yaml",
    "sUWA (tau=0.25)": "configs/digits.yaml",
    "ERA (T=0.1)": "configs/digits_era.yaml",
    "Entropy weighting": "configs/digits_entropy.yaml",
    "Logit variance": "configs/digits_logit_variance.yaml",
    "MM": "configs/digits_meta_model.yaml",
    "Selective-FD soft": "configs/digits_selective_fd.yaml",
    "Selective-FD hard": "configs/digits_selective_fd_hard.yaml",
    "FedGO": "configs/digits_fedgo.yaml",
    "LKD": "configs/digits_lkd.yaml",
    "Oracle (uses labels)": "configs/digits_oracle.yaml",
}


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_").lower()


def run_one(out: Path, name: str, k: int, seed: int, extra: list[str]) -> dict | None:
    run_dir = out / f"{slug(name)}-k{k}-seed{seed}"
    done = [p for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]
    if not done:
        cmd = [sys.executable, "-m", "fdlit", "fit", "--config", RULES[name],
               "--data.classes_per_client", str(k), "--seed", str(seed),
               "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(run_dir), *extra]
        # one thread per run: parallel runs of these small models oversubscribe 2 cores otherwise
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        if res.returncode != 0:
            print(f"FAILED {name} k={k} seed={seed}: {res.stderr[-2000:]}", file=sys.stderr, flush=True)
            return None
        done = [p for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]
    print(f"done {name} k={k} seed={seed}", file=sys.stderr, flush=True)
    return json.loads(sorted(done)[-1].read_text()) if done else None


def table(results: dict, rules: list[str], ks: list[int]) -> str:
    lines = ["| rule | " + " | ".join(f"k={k}" for k in ks) + " | MiB up+down (k=2) |",
             "|---|" + "---|" * (len(ks) + 1)]
    for name in rules:
        cells = []
        for k in ks:
            v = [100 * s["best_global_acc_mean"] for s in results.get((name, k), [])]
            if not v:
                cells.append("–")
                continue
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):.1f} ± {sd:.1f}" + ("" if len(v) == 3 else f" (n={len(v)})"))
        b = [(s["bytes_up_total"] + s["bytes_down_total"]) / 2**20 for s in results.get((name, 2), [])]
        cells.append(f"{statistics.mean(b):.2f}" if b else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("runs/compare"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 5, 9])
    p.add_argument("--rules", nargs="+", default=list(RULES), help=f"subset of: {list(RULES)}")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the raw summaries here")
    p.add_argument("extra", nargs="*", help="extra fit flags, after --")
    a = p.parse_args()
    unknown = [r for r in a.rules if r not in RULES]
    if unknown:
        p.error(f"unknown rules {unknown}; known: {list(RULES)}")
    # seed-major order: a grid cut short still has every rule and k for the first seeds
    grid = [(name, k, seed) for seed, name, k in itertools.product(a.seeds, a.rules, a.ks)]
    with ThreadPoolExecutor(a.jobs) as pool:
        summaries = list(pool.map(lambda g: run_one(a.out, *g, a.extra), grid))
    results: dict = {}
    for (name, k, _), s in zip(grid, summaries):  # noqa: B007
        if s is not None:
            results.setdefault((name, k), []).append(s)
    if a.json:
        a.json.write_text(json.dumps({f"{n}|k={k}": v for (n, k), v in results.items()}, indent=1))
    print(table(results, a.rules, a.ks))


if __name__ == "__main__":
    main()
