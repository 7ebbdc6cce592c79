"""The digits privacy study (docs/privacy.md): accuracy against epsilon for AVG and sUWA, and the
membership-inference audit's attack AUC without DP, with DP and with hard labels.

    python scripts/privacy_study.py --out runs/privacy_study [--seeds 0 1 2] [--sigmas 0 0.03 0.3]
        [--clip 5] [--jobs 2] [--figure docs/privacy_study.png] [-- extra fit flags, e.g. --federation.rounds 3]

Each run is a normal ``fit`` of ``configs/digits.yaml`` (k = 2, 20 clients) with W&B disabled and
``privacy.audit: true``; sigma = 0 is the run without DP. Rows: (method, setting); columns: the
final round's mean global accuracy after the public phase, the best one, epsilon (delta 1e-5) and
the attack AUC, mean +- std over seeds. Finished runs are reused on re-run. ``--figure`` also draws
final accuracy against epsilon (left) and the attack AUC per setting (right).
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

METHODS = {  # hard labels carry no logits, so sUWA sends its density scores (aggregator.upload: scores)
    "AVG": ["--aggregator", "fdlit.aggregators.ProbabilityAveragingAggregator"],
    "sUWA": ["--aggregator", "fdlit.aggregators.SmoothedUncertaintyWeightedAggregator"],
}
HARD = {"AVG": [], "sUWA": ["--aggregator.upload", "scores"]}


def settings(sigmas: list[float]) -> list[tuple[str, list[str]]]:
    out = []
    for s in sigmas:
        out.append(("no DP" if s == 0 else f"DP sigma={s:g}", [] if s == 0 else ["--privacy.noise_multiplier", str(s)]))
    out.append(("hard labels, no DP", ["--privacy.encoding", "hard"]))
    return out


def run_one(out: Path, method: str, setting: str, flags: list[str], seed: int, clip: float, extra: list[str]) -> dict:
    run_dir = out / f"{method}-{setting.replace(' ', '_').replace(',', '').replace('=', '')}-seed{seed}"
    done = [p.parent for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]
    if not done:
        hard = HARD[method] if "hard" in setting else []
        cmd = [sys.executable, "-m", "fdlit", "fit", "--config", "configs/digits.yaml", *METHODS[method], *hard,
               *flags, "--privacy.clip_norm", str(clip), "--privacy.audit", "true", "--seed", str(seed),
               "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(run_dir), *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per run: parallel runs share 2 cores
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        done = [p.parent for p in run_dir.glob("*/summary.json")]
    rows = [json.loads(line) for line in (done[0] / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = rows[-1]
    return {"final": last["after_public/global_acc_mean"],
            "best": max(r["after_public/global_acc_mean"] for r in rows if r["after_public/global_acc_mean"] is not None),
            "epsilon": last.get("privacy/epsilon", float("inf")), "auc": last["privacy/mia_auc"]}


def fmt(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
    if any(v == float("inf") for v in values):
        return "∞"
    mean = statistics.mean(values) * scale
    std = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("runs/privacy_study"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.03, 0.3])
    p.add_argument("--clip", type=float, default=5.0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--figure", type=Path, default=None, help="also write a PNG figure here")
    p.add_argument("extra", nargs="*", help="extra fit flags, after --")
    a = p.parse_args()
    grid = [(m, name, flags, seed) for m, (name, flags), seed in itertools.product(METHODS, settings(a.sigmas), a.seeds)]
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda g: run_one(a.out, *g, a.clip, a.extra), grid))
    print("| method | setting | final accuracy (%) | best accuracy (%) | ε (δ = 1e-5) | attack AUC |")
    print("|---|---|---|---|---|---|")
    for m, (name, _) in itertools.product(METHODS, settings(a.sigmas)):
        rows = [r for g, r in zip(grid, results) if g[0] == m and g[1] == name]
        eps = [r["epsilon"] for r in rows]
        eps_text = "∞" if any(e == float("inf") for e in eps) else f"{statistics.mean(eps):.4g}"
        print(f"| {m} | {name} | {fmt([r['final'] for r in rows])} | {fmt([r['best'] for r in rows])} | "
              f"{eps_text} | {fmt([r['auc'] for r in rows], 1.0, 3)} |")
    if a.figure is not None:
        figure(a.figure, grid, results, settings(a.sigmas))


def figure(path: Path, grid: list, results: list[dict], names: list[tuple[str, list[str]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    def cell(m: str, name: str, key: str) -> list[float]:
        return [r[key] for g, r in zip(grid, results) if g[0] == m and g[1] == name]

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for j, m in enumerate(METHODS):
        color = f"C{j}"
        dp = [n for n, _ in names if n.startswith("DP")]
        eps = [statistics.mean(cell(m, n, "epsilon")) for n in dp]
        acc = [100 * statistics.mean(cell(m, n, "final")) for n in dp]
        err = [100 * statistics.stdev(v) if len(v := cell(m, n, "final")) > 1 else 0.0 for n in dp]
        left.errorbar(eps, acc, yerr=err, marker="o", color=color, label=f"{m}, DP")
        left.axhline(100 * statistics.mean(cell(m, "no DP", "final")), color=color, ls="--", label=f"{m}, no DP")
        aucs = [cell(m, n, "auc") for n, _ in names]
        xs = [i + 0.4 * j for i in range(len(names))]
        right.bar(xs, [statistics.mean(v) for v in aucs], 0.4, color=color, label=m,
                  yerr=[statistics.stdev(v) if len(v) > 1 else 0.0 for v in aucs])
    left.set_xscale("log")
    left.set_xlabel("ε (δ = 1e-5), client level")
    left.set_ylabel("final mean global accuracy (%)")
    left.legend(fontsize=8)
    right.axhline(0.5, color="grey", lw=0.8)
    right.set_xticks([i + 0.2 for i in range(len(names))], [n for n, _ in names], fontsize=8)
    right.set_ylabel("membership-inference AUC")
    right.set_ylim(0.4, 1.0)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
