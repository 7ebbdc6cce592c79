"""CPU seconds per round of each method on digits, relative to AVG.

    python benchmarks/method_rounds.py [--rounds 4] [--repeats 2] [--glibc-default] [configs/digits_*.yaml ...]

Each config runs ``--rounds`` rounds (W&B disabled, one thread) in a fresh interpreter; the CPU
time of this process (``time.process_time``) is read at the end of every round, and a round's cost
is the median over rounds 2.. (round 1 trains longer and holds the methods' set-up). Configs run
one after another within each repeat (paired, interleaved); the ratio to AVG
(configs/digits_avg.yaml) is taken per repeat, and its median printed. No configs: every
configs/digits*.yaml. Each run sets glibc's allocator as ``fdlit fit`` does
(:mod:`fdlit.execution.allocator`); ``--glibc-default`` adds a second column per config with glibc's
defaults, run right after it in the same repeat (paired).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AVG = "configs/digits_avg.yaml"
CHILD = """
import json, sys, tempfile, time
from fdlit.callbacks import FederationCallback
from fdlit.configuration.schema import parse_fit
from fdlit.execution.allocator import keep_large_blocks
from fdlit.runs.experiment import Experiment

if sys.argv[3] == "fit":
    keep_large_blocks()

class Clock(FederationCallback):
    def __init__(self):
        self.stamps = []
    def on_round_end(self, loop, round, metrics):
        self.stamps.append(time.process_time())

parser, cfg = parse_fit(["--config", sys.argv[1], "--federation.rounds", sys.argv[2], "--logger.mode", "disabled",
                         "--logger.progress", "false", "--logger.run_dir", tempfile.mkdtemp()])
experiment = Experiment(cfg, parser)
clock = Clock()
experiment.loop.callbacks.append(clock)
experiment.fit()
print("ROUNDS=" + json.dumps([b - a for a, b in zip(clock.stamps, clock.stamps[1:])]))
"""


def round_cpu(config: str, rounds: int, allocator: str = "fit") -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD, config, str(rounds), allocator], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"{config} failed: {out.stderr[-800:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("ROUNDS=")][-1]
    return statistics.median(json.loads(line[len("ROUNDS="):]))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--glibc-default", action="store_true", help="also run each config with glibc's defaults")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 1 is not counted)")
    configs = args.configs or sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("configs/digits*.yaml"))
    configs = [AVG] + [c for c in configs if c != AVG]
    samples: dict[str, list[float]] = {c: [] for c in configs}
    plain: dict[str, list[float]] = {c: [] for c in configs}
    for _ in range(args.repeats):
        for c in configs:
            samples[c].append(round_cpu(c, args.rounds))
            if args.glibc_default:
                plain[c].append(round_cpu(c, args.rounds, "default"))
    extra = f" {'glibc default':>13} {'x AVG':>6} {'fit/default':>11}" if args.glibc_default else ""
    print(f"{'config':<48} {'CPU s/round':>11} {'x AVG':>6}{extra}   (median of {args.repeats}, rounds 2-{args.rounds})")
    ratios = {}
    for c in configs:
        ratios[c] = statistics.median(s / a for s, a in zip(samples[c], samples[AVG], strict=True))
        line = f"{c:<48} {statistics.median(samples[c]):11.3f} {ratios[c]:6.2f}"
        if args.glibc_default:
            line += (f" {statistics.median(plain[c]):13.3f}"
                     f" {statistics.median(s / a for s, a in zip(plain[c], plain[AVG], strict=True)):6.2f}"
                     f" {statistics.median(s / p for s, p in zip(samples[c], plain[c], strict=True)):11.2f}")
        print(line)
    return ratios


if __name__ == "__main__":
    main()
