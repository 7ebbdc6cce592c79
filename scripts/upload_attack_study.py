"""What FD's uploads reveal, and what secure aggregation costs (docs/privacy.md, "Attacks on uploads").

    python scripts/upload_attack_study.py --out runs/upload_attacks [--methods AVG sUWA] [--ks 2 10]
        [--sigma 0.1] [--clip 5] [--seeds 0] [-- extra fit flags, e.g. --federation.rounds 3]

Each run is a normal ``fit`` of ``configs/digits.yaml`` (20 clients, k classes each) with W&B disabled and
``privacy.upload_audit: true``, in three settings: no DP; DP with noise on each client (``accounting:
local``, sigma ``--sigma``, clip ``--clip``); secure aggregation (no DP). Rows: (method, k, setting);
columns: the last round's mean global accuracy, the label-distribution attack's total-variation error
(mean over rounds and clients) against the uniform guess's, the membership attack's AUC and TPR at 1 %
FPR from the clients' predictions (last round), bytes up per round and secure aggregation's seconds per
round (mean +- std over seeds where several). Runs go one at a time; finished ones are reused on re-run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

METHODS = {"AVG": ["--aggregator", "fdlit.methods.ProbabilityAveraging"],
           "sUWA": ["--aggregator", "fdlit.methods.SmoothedUncertaintyWeighted"]}


def settings(sigma: float, clip: float) -> dict[str, list[str]]:
    return {"no DP": [],
            f"DP local sigma={sigma:g}": ["--privacy.noise_multiplier", str(sigma), "--privacy.clip_norm", str(clip)],
            "secure aggregation": ["--privacy.secure_aggregation", "true"]}


def run_one(out: Path, method: str, k: int, setting: str, flags: list[str], seed: int, extra: list[str]) -> list[dict]:
    run_dir = out / f"{method}-k{k}-{setting.replace(' ', '_').replace('=', '')}-seed{seed}"
    done = [p.parent for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]
    if not done:
        cmd = [sys.executable, "-m", "fdlit", "fit", "--config", "configs/digits.yaml", *METHODS[method],
               "--data.classes_per_client", str(k), *flags, "--privacy.upload_audit", "true", "--seed", str(seed),
               "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(run_dir), *extra]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
        done = [p.parent for p in run_dir.glob("*/summary.json")]
    return [json.loads(line) for line in (done[0] / "metrics.jsonl").read_text().splitlines() if line.strip()]


def cell(values: list[float], digits: int = 3, scale: float = 1.0) -> str:
    values = [v * scale for v in values if v is not None]
    if not values:
        return "–"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f}" + (f" ± {std:.{digits}f}" if len(values) > 1 else "")


def summary(rows: list[dict]) -> dict[str, float | None]:
    last = rows[-1]

    def mean_over_rounds(key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.mean(values) if values else None

    return {"acc": last["after_public/global_acc_mean"], "tv": mean_over_rounds("privacy/label_tv"),
            "chance": mean_over_rounds("privacy/label_tv_chance"), "auc": last.get("privacy/upload_mia_auc"),
            "tpr": last.get("privacy/upload_mia_tpr_at_1fpr"), "up_mib": mean_over_rounds("comm/up_bytes") / 2**20,
            "secagg_s": mean_over_rounds("time/secagg_s"), "round_s": mean_over_rounds("time/round_s")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("runs/upload_attacks"))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--ks", type=int, nargs="+", default=[2, 10])
    p.add_argument("--sigma", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=5.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("extra", nargs="*", help="extra fit flags, after --")
    a = p.parse_args()
    grid = settings(a.sigma, a.clip)
    print("| method | k | setting | final accuracy (%) | label TV (chance) | MIA AUC | TPR @ 1 % FPR | "
          "up MiB / round | secure agg. s / round (round s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for method, k, (name, flags) in itertools.product(a.methods, a.ks, grid.items()):
        s = [summary(run_one(a.out, method, k, name, flags, seed, a.extra)) for seed in a.seeds]

        def col(key, digits=3, scale=1.0, s=s):
            return cell([x[key] for x in s], digits, scale)

        print(f"| {method} | {k} | {name} | {col('acc', 2, 100)} | {col('tv')} ({col('chance')}) | {col('auc')} | "
              f"{col('tpr')} | {col('up_mib', 3)} | {col('secagg_s', 2)} ({col('round_s', 1)}) |", flush=True)


if __name__ == "__main__":
    main()
