"""Accuracy against communicated bytes on digits: federated distillation vs parameter exchange.

    python scripts/bytes_study.py --out runs/bytes_study [--rounds 10] [--seeds 0 1 2] [--ks 2 9] [--jobs 2] [--methods ...]

The digits counterpart of Kovalchuk et al. 2026, Sec. 5.4 (FD's bytes set against SCAFFOLD's).
Each run is a normal ``fit`` with W&B disabled: FD with AVG and sUWA (``configs/digits.yaml``),
FedAvg, FedProx and SCAFFOLD (``configs/digits_fedavg.yaml`` etc.), all on the
same 20-client federation, MLP and round schedule, cut to ``--rounds`` rounds. Every round's mean
global test accuracy (after the round's last phase: after distillation for FD, the averaged global
model for parameter exchange) is set against the cumulative bytes of the run's communication
ledger, per client (up + down, the set-up messages of round 0 included), 1 MB = 10^6 bytes as in
the paper. Writes a markdown table (``--table``) and a figure (``--figure``, mean over seeds, band
= min..max). Finished runs are reused on re-run.
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

# name -> (config, extra fit flags)
METHODS = {
    "FD AVG": ("configs/digits.yaml", ["--aggregator", "fdlit.methods.ProbabilityAveraging"]),
    "FD sUWA": ("configs/digits.yaml", []),
    "FedAvg": ("configs/digits_fedavg.yaml", []),
    "FedProx": ("configs/digits_fedprox.yaml", []),
    "SCAFFOLD": ("configs/digits_scaffold.yaml", []),
}
MB = 1e6


def run_one(out: Path, name: str, k: int, seed: int, rounds: int, extra: list[str]) -> list[dict]:
    """One fit; returns its per-round rows (round, accuracy, cumulative bytes up and down)."""
    run_dir = out / f"{name.replace(' ', '_')}-k{k}-R{rounds}-seed{seed}"
    done = [p for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]
    if not done:
        config, flags = METHODS[name]
        cmd = [sys.executable, "-m", "fdlit", "fit", "--config", config, *flags,
               "--data.classes_per_client", str(k), "--seed", str(seed), "--federation.rounds", str(rounds),
               "--federation.eval_every_n_rounds", "1",
               "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(run_dir), *extra]
        # one thread per run: parallel runs of these small models oversubscribe the cores otherwise
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        done = list(run_dir.glob("*/summary.json"))
    metrics = done[0].parent / "metrics.jsonl"
    return [{"round": r["round"], "acc": r["after_public/global_acc_mean"],
             "up": r["comm/up_bytes_total"], "down": r["comm/down_bytes_total"]}
            for r in map(json.loads, metrics.read_text().splitlines())]


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values) if len(values) > 1 else 0:.2f}"


def table(results: dict, methods: list[str], ks: list[int], num_clients: int) -> str:
    lines = ["| method | k | acc. after round R (%) | best acc. (%) | rounds to 95% of own best | "
             "MB per client to 95% of own best | MB per client up / down, R rounds |",
             "|---|---|---|---|---|---|---|"]
    for name, k in itertools.product(methods, ks):
        runs = [rows for (n, kk, _), rows in results.items() if n == name and kk == k]
        final = [100 * rows[-1]["acc"] for rows in runs]
        best = [100 * max(r["acc"] for r in rows) for rows in runs]
        # the first round whose accuracy reaches 95% of the run's best: "converged" in the paper's sense
        reach = [next(r for r in rows if r["acc"] >= 0.95 * max(x["acc"] for x in rows)) for rows in runs]
        mb = [(r["up"] + r["down"]) / num_clients / MB for r in reach]
        up = statistics.mean(rows[-1]["up"] for rows in runs) / num_clients / MB
        down = statistics.mean(rows[-1]["down"] for rows in runs) / num_clients / MB
        lines.append(f"| {name} | {k} | {mean_std(final)} | {mean_std(best)} | "
                     f"{statistics.mean(r['round'] for r in reach):.1f} | {mean_std(mb)} | "
                     f"{up:.3f} / {down:.3f} |")
    return "\n".join(lines)


def figure(results: dict, methods: list[str], ks: list[int], num_clients: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ks), figsize=(5.5 * len(ks), 4), squeeze=False)
    for ax, k in zip(axes[0], ks, strict=True):
        for name in methods:
            runs = [rows for (n, kk, _), rows in results.items() if n == name and kk == k]
            # every seed has the same byte count per round (fixed message sizes), so rounds line up
            x = [(r["up"] + r["down"]) / num_clients / MB for r in runs[0]]
            accs = list(zip(*[[100 * r["acc"] for r in rows] for rows in runs], strict=True))
            ax.plot(x, [statistics.mean(a) for a in accs], marker="o", ms=3, label=name)
            ax.fill_between(x, [min(a) for a in accs], [max(a) for a in accs], alpha=0.2)
        ax.set_xscale("log")
        ax.set_xlabel("cumulative MB per client (up + down)")
        ax.set_ylabel("mean global test accuracy (%)")
        ax.set_title(f"digits, 20 clients, k = {k}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("runs/bytes_study"))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ks", type=int, nargs="+", default=[2, 9])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--num-clients", type=int, default=20, help="as in the configs; bytes are reported per client")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--table", type=Path, default=None, help="also write the markdown table here")
    p.add_argument("--figure", type=Path, default=Path("docs/bytes_study.png"))
    p.add_argument("extra", nargs="*", help="extra fit flags, after --")
    a = p.parse_args()
    grid = list(itertools.product(a.methods, a.ks, a.seeds))
    extra = [*a.extra, "--data.num_clients", str(a.num_clients)]
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(lambda g: run_one(a.out, *g, a.rounds, extra), grid))
    results = dict(zip(grid, rows, strict=True))
    text = table(results, a.methods, a.ks, a.num_clients)
    print(text)
    if a.table:
        a.table.parent.mkdir(parents=True, exist_ok=True)
        a.table.write_text(text + "\n")
    figure(results, a.methods, a.ks, a.num_clients, a.figure)


if __name__ == "__main__":
    main()
