"""The digits privacy study (docs/privacy.md): accuracy against epsilon for AVG and sUWA under the
local and the central threat model, and the membership-inference audit's attack AUC without DP,
with DP and with hard labels.

    python scripts/privacy_study.py --out runs/privacy_study [--methods AVG sUWA] [--seeds 0 1 2]
        [--sigmas 0 0.03 0.3] [--accounting local central] [--clip 5] [--central-clip 1] [--jobs 1]
        [--no-hard] [--figure docs/privacy_study.png] [-- extra fit flags, e.g. --federation.rounds 10]

Each run is a normal ``fit`` of ``configs/digits.yaml`` (k = 2, 20 clients) with W&B disabled and
``privacy.audit: true``; sigma = 0 is the run without DP. ``local`` runs clip the logit rows to
``--clip``; ``central`` runs (secure aggregation, rules with a summed teacher only: AVG) clip the
summed rows (AVG: probabilities, norm <= 1) to ``--central-clip``. Rows: (method, setting); columns:
the final round's mean global accuracy after the public phase, the best one, epsilon (delta 1e-5,
the largest per-client figure) and the attack AUC, mean +- std over seeds. Finished runs are reused
on re-run. ``--figure`` also draws final accuracy against epsilon (left) and the attack AUC per
setting (right).
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
    "AVG": ["--aggregator", "fdlit.methods.ProbabilityAveraging"],
    "sUWA": ["--aggregator", "fdlit.methods.SmoothedUncertaintyWeighted"],
}
HARD = {"AVG": [], "sUWA": ["--aggregator.upload", "scores"]}
SUMMED = {"AVG"}  # the rules whose teacher is a function of the clients' mean (the central model)


def settings(sigmas: list[float], accounting: list[str], clip: float, central_clip: float,
             hard: bool = True) -> list[tuple[str, list[str]]]:
    out = []
    for s in sigmas:
        if s == 0:
            out.append(("no DP", []))
            continue
        for model in accounting:
            out.append((f"DP {model} sigma={s:g}", ["--privacy.noise_multiplier", str(s), "--privacy.accounting", model,
                                                    "--privacy.clip_norm", str(clip if model == "local" else central_clip)]))
    if hard:
        out.append(("hard labels, no DP", ["--privacy.encoding", "hard"]))
    return out


def applies(method: str, setting: str) -> bool:
    return "central" not in setting or method in SUMMED


def run_one(out: Path, method: str, setting: str, flags: list[str], seed: int, extra: list[str]) -> dict:
    run_dir = out / f"{method}-{setting.replace(' ', '_').replace(',', '').replace('=', '')}-seed{seed}"
    done = [p.parent for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]
    if not done:
        hard = HARD[method] if "hard" in setting else []
        cmd = [sys.executable, "-m", "fdlit", "fit", "--config", "configs/digits.yaml", *METHODS[method], *hard,
               *flags, "--privacy.audit", "true", "--seed", str(seed),
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
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.03, 0.3])
    p.add_argument("--accounting", nargs="+", default=["local", "central"], choices=["local", "central"])
    p.add_argument("--clip", type=float, default=5.0, help="clip norm of the local model's logit rows")
    p.add_argument("--central-clip", type=float, default=1.0, help="clip norm of the central model's summed rows")
    p.add_argument("--no-hard", action="store_true", help="leave out the hard-label setting")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--figure", type=Path, default=None, help="also write a PNG figure here")
    p.add_argument("extra", nargs="*", help="extra fit flags, after --")
    a = p.parse_args()
    names = settings(a.sigmas, a.accounting, a.clip, a.central_clip, not a.no_hard)
    grid = [(m, name, flags, seed) for m, (name, flags), seed in itertools.product(a.methods, names, a.seeds)
            if applies(m, name)]
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda g: run_one(a.out, *g, a.extra), grid))
    print("| method | setting | final accuracy (%) | best accuracy (%) | ε (δ = 1e-5) | attack AUC |")
    print("|---|---|---|---|---|---|")
    for m, (name, _) in itertools.product(a.methods, names):
        rows = [r for g, r in zip(grid, results, strict=True) if g[0] == m and g[1] == name]
        if not rows:
            continue
        eps = [r["epsilon"] for r in rows]
        eps_text = "∞" if any(e == float("inf") for e in eps) else f"{statistics.mean(eps):.4g}"
        print(f"| {m} | {name} | {fmt([r['final'] for r in rows])} | {fmt([r['best'] for r in rows])} | "
              f"{eps_text} | {fmt([r['auc'] for r in rows], 1.0, 3)} |")
    if a.figure is not None:
        figure(a.figure, grid, results, names, a.methods)


def figure(path: Path, grid: list, results: list[dict], names: list[tuple[str, list[str]]], methods: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    def cell(m: str, name: str, key: str) -> list[float]:
        return [r[key] for g, r in zip(grid, results, strict=True) if g[0] == m and g[1] == name]

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        color = f"C{j}"
        for model, marker in (("local", "o"), ("central", "s")):
            dp = [n for n, _ in names if n.startswith(f"DP {model}") and cell(m, n, "final")]
            if not dp:
                continue
            eps = [statistics.mean(cell(m, n, "epsilon")) for n in dp]
            acc = [100 * statistics.mean(cell(m, n, "final")) for n in dp]
            err = [100 * statistics.stdev(v) if len(v := cell(m, n, "final")) > 1 else 0.0 for n in dp]
            left.errorbar(eps, acc, yerr=err, marker=marker, color=color, label=f"{m}, DP {model}")
        if cell(m, "no DP", "final"):
            left.axhline(100 * statistics.mean(cell(m, "no DP", "final")), color=color, ls="--", label=f"{m}, no DP")
        shown = [(i, v) for i, (n, _) in enumerate(names) if (v := cell(m, n, "auc"))]
        right.bar([i + width * j for i, _ in shown], [statistics.mean(v) for _, v in shown], width, color=color,
                  label=m, yerr=[statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in shown])
    left.set_xscale("log")
    left.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # labels on the decades only
    left.set_xlabel("ε (δ = 1e-5), client level")
    left.set_ylabel("final mean global accuracy (%)")
    left.legend(fontsize=8)
    right.axhline(0.5, color="grey", lw=0.8)
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], [n for n, _ in names], fontsize=7, rotation=30,
                     ha="right")
    right.set_ylabel("membership-inference AUC")
    right.set_ylim(0.4, 1.0)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
