"""The digits adversaries study (docs/adversaries.md): the honest clients' accuracy against the
fraction of attackers, per rule and attack.

    python scripts/adversaries_study.py --out runs/adversaries_study [--rules AVG UWA ...]
        [--attacks label_flip byzantine density] [--fractions 0 0.1 0.2 0.3] [--seeds 0] [--jobs 1]
        [--figure docs/adversaries_study.png] [-- extra fit flags]

Each run is a normal ``fit`` of the rule's ``configs/digits_<rule>.yaml`` (20 clients, k = 2) with W&B
disabled and a shortened schedule (``SCHEDULE``: 8 rounds) so the whole grid takes minutes on a CPU.
Attacks: ``label_flip`` (every rule: LabelFlipping, y -> C - 1 - y), ``byzantine`` (prediction
exchange: ConfidentWrong, every sample called class 0; parameter exchange: SignFlippedUpdate) and
``density`` (UWA and sUWA only: FabricatedDensity). Attackers are drawn once from the seed. Krum is
told f = 6 (30 % of 20) in every run. Cells: the final round's mean global accuracy of the honest
clients after the exchange (%) and, in brackets, the attackers' total weight in the teacher or the
global model (``adversaries/weight``; "–" where the rule has no weights). Finished runs are reused.

The figures, one per attack with a line per rule and the attackers' weight beside it, come from
``python -m fdlit report runs/adversaries_study`` (``report/figures/adversaries_<attack>.*``); ``--figure``
draws all attacks side by side in one PNG.
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

RULES = {  # name: (config, exchange, extra flags)
    "AVG": ("configs/digits_avg.yaml", "predictions", []),
    "UWA": ("configs/digits_uwa.yaml", "predictions", []),
    "sUWA": ("configs/digits.yaml", "predictions", []),
    "ERA": ("configs/digits_era.yaml", "predictions", []),
    "median": ("configs/digits_median.yaml", "predictions", []),
    "trimmed mean": ("configs/digits_trimmed_mean.yaml", "predictions", []),
    "FedAvg": ("configs/digits_fedavg.yaml", "parameters", []),
    "Krum": ("configs/digits_krum.yaml", "parameters", ["--aggregator.byzantine", "6"]),
}
ATTACKS = {  # name: {exchange: flags}; a rule whose exchange is missing is not attacked this way
    "label_flip": {"predictions": ["--adversaries.attack", "fdlit.adversaries.LabelFlipping"],
                   "parameters": ["--adversaries.attack", "fdlit.adversaries.LabelFlipping"]},
    "byzantine": {"predictions": ["--adversaries.attack", "fdlit.adversaries.ConfidentWrong",
                                  "--adversaries.attack.target", "0"],
                  "parameters": ["--adversaries.attack", "fdlit.adversaries.SignFlippedUpdate"]},
    "density": {"predictions": ["--adversaries.attack", "fdlit.adversaries.FabricatedDensity"]},
}
DENSITY_RULES = {"UWA", "sUWA"}
SCHEDULE = ["--federation.rounds", "8", "--federation.private_epochs_first", "10", "--federation.private_epochs", "3",
            "--federation.public_epochs_first", "3", "--federation.public_epochs", "3",
            "--federation.eval_every_n_rounds", "8"]


def applies(rule: str, attack: str) -> bool:
    return RULES[rule][1] in ATTACKS[attack] and (attack != "density" or rule in DENSITY_RULES)


def run_one(out: Path, rule: str, attack: str, fraction: float, seed: int, extra: list[str]) -> dict:
    config, exchange, flags = RULES[rule]
    attack_flags = [] if fraction == 0 else [*ATTACKS[attack][exchange], "--adversaries.fraction", str(fraction)]
    tag = "none" if fraction == 0 else f"{attack}-{fraction:g}"
    run_dir = out / f"{rule.replace(' ', '_')}-{tag}-seed{seed}"
    done = [p.parent for p in run_dir.glob("*/summary.json") if json.loads(p.read_text()).get("finished")]
    if not done:
        cmd = [sys.executable, "-m", "fdlit", "fit", "--config", config, *flags, *SCHEDULE, *attack_flags,
               "--seed", str(seed), "--logger.mode", "disabled", "--logger.progress", "false",
               "--logger.run_dir", str(run_dir), *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        done = [p.parent for p in run_dir.glob("*/summary.json")]
    last = [json.loads(line) for line in (done[0] / "metrics.jsonl").read_text().splitlines() if line.strip()][-1]
    honest = last.get("adversaries/honest_global_acc", last["after_public/global_acc_mean"])
    weight = last.get("adversaries/weight", 0.0 if fraction == 0 else None)
    return {"honest": honest, "weight": weight}


def cell(results: list[dict]) -> str:
    acc = statistics.mean(r["honest"] for r in results) * 100
    weights = [r["weight"] for r in results if r["weight"] is not None and r["weight"] == r["weight"]]
    return f"{acc:.1f}" + (f" ({statistics.mean(weights):.2f})" if weights else " (–)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("runs/adversaries_study"))
    p.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    p.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--figure", type=Path, default=None, help="also write one PNG of every attack side by side here")
    p.add_argument("extra", nargs="*", help="extra fit flags, after --")
    a = p.parse_args()
    grid = sorted({(rule, "none" if f == 0 else attack, f, seed)
                   for rule, attack, f, seed in itertools.product(a.rules, a.attacks, a.fractions, a.seeds)
                   if applies(rule, attack)})
    with ThreadPoolExecutor(a.jobs) as pool:
        results = dict(zip(grid, pool.map(lambda g: run_one(a.out, *g, a.extra), grid), strict=True))

    def of(rule, attack, f):
        return [r for (ru, at, fr, _), r in results.items() if ru == rule and fr == f and at == ("none" if f == 0 else attack)]

    for attack in a.attacks:
        rules = [r for r in a.rules if applies(r, attack)]
        print(f"\n{attack}: honest clients' final mean global accuracy (%), (attackers' weight)\n")
        print("| rule | " + " | ".join(f"{f:.0%} attackers" for f in a.fractions) + " |")
        print("|---|" + "---|" * len(a.fractions))
        for rule in rules:
            print(f"| {rule} | " + " | ".join(cell(of(rule, attack, f)) for f in a.fractions) + " |")
    print(f"\nfigures, one per attack: python -m fdlit report {a.out}")
    if a.figure is not None:
        figure(a.figure, a, of)


def figure(path: Path, a, of) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(a.attacks), figsize=(4.2 * len(a.attacks), 3.6), squeeze=False)
    for ax, attack in zip(axes[0], a.attacks, strict=True):
        for j, rule in enumerate(r for r in a.rules if applies(r, attack)):
            acc = [100 * statistics.mean(x["honest"] for x in of(rule, attack, f)) for f in a.fractions]
            ax.plot([100 * f for f in a.fractions], acc, marker="o", color=f"C{j}",
                    ls="--" if RULES[rule][1] == "parameters" else "-", label=rule)
        ax.set_title(attack.replace("_", " "))
        ax.set_xlabel("attackers (% of clients)")
        ax.set_ylabel("honest clients' accuracy (%)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
