"""Every aggregation rule side by side on digits: best mean global accuracy +- std over
seeds, and total bytes (up + down, mean over seeds), for k classes per client.

    python scripts/compare_aggregators.py --out runs/compare [--seeds 0 1 2] [--ks 1 2 3 5 9] \
        [--rules AVG sUWA ...] [--jobs 2] [-- --federation.rounds 6]

Each run is a normal ``fit`` of the rule's config under ``configs/`` with W&B disabled, one thread
per run; finished runs (their summary.json says ``finished``) are reused, so the script can be
re-run to fill in a grid. The table is printed as Markdown; ``--json`` also writes the raw numbers.

Runs execute in ``--jobs`` forked worker processes that import fdlit once: on a loaded 2-core
machine starting a fresh interpreter per run (torch, Lightning, scikit-learn imports) cost ~40 s,
several times a small digits run itself.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import statistics
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
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
    "LKD server-scored (100 public labels)": "configs/digits_lkd_server.yaml",
    "Oracle (uses labels)": "configs/digits_oracle.yaml",
}


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_").lower()


def _worker_init() -> None:
    # one thread per run: parallel runs of these small models oversubscribe 2 cores otherwise
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    import fdlit.cli  # noqa: F401  (imported once per worker, before the first run)


def _fit(argv: list[str]) -> str:
    from fdlit.cli import main

    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            code = main(["fit", *argv])
        return "" if code == 0 else f"exit code {code}"
    except Exception:  # report and go on with the grid
        return traceback.format_exc()[-2000:]


def finished(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished"))


def fit_args(out: Path, name: str, k: int, seed: int, extra: list[str]) -> list[str]:
    return ["--config", RULES[name], "--data.classes_per_client", str(k), "--seed", str(seed),
            "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(out / f"{slug(name)}-k{k}-seed{seed}"), *extra]


def table(results: dict, rules: list[str], ks: list[int]) -> str:
    lines = ["| rule | " + " | ".join(f"k={k}" for k in ks) + " | MiB up / down (k=2) |",
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
        runs = results.get((name, 2), [])
        if runs:
            up = statistics.mean(s["bytes_up_total"] for s in runs) / 2**20
            down = statistics.mean(s["bytes_down_total"] for s in runs) / 2**20
            cells.append(f"{up:.2f} / {down:.2f}")
        else:
            cells.append("–")
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
    todo = [g for g in grid if not finished(a.out / f"{slug(g[0])}-k{g[1]}-seed{g[2]}")]
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(a.jobs, mp_context=ctx, initializer=_worker_init) as pool:
        futures = [(g, pool.submit(_fit, fit_args(a.out, *g, a.extra))) for g in todo]
        for (name, k, seed), fut in futures:
            err = fut.result()
            print(f"{'FAILED' if err else 'done'} {name} k={k} seed={seed} {err}", file=sys.stderr, flush=True)
    summaries = []
    for name, k, seed in grid:
        done = finished(a.out / f"{slug(name)}-k{k}-seed{seed}")
        summaries.append(json.loads(done[-1].read_text()) if done else None)
    results: dict = {}
    for (name, k, _), s in zip(grid, summaries, strict=True):  # noqa: B007
        if s is not None:
            results.setdefault((name, k), []).append(s)
    if a.json:
        from fdlit.runs import strict_json

        a.json.write_text(strict_json.dumps({f"{n}|k={k}": v for (n, k), v in results.items()}, indent=1))
    print(table(results, a.rules, a.ks))


if __name__ == "__main__":
    main()
