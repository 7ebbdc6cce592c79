"""What the virtual clock and the staleness bookkeeping cost, as a share of a digits run's CPU.

Two measurements (CPU seconds, ``time.process_time``, one torch thread):

1. interleaved pairs of the same digits run without a clock and under an AsynchronousClock that
   trains exactly the same (equal devices, a buffer of every client: the same teachers to the bit),
   so the difference is the clock's and the cache's bookkeeping alone;
2. a heterogeneous asynchronous run (log-normal devices, a buffer of 5, polynomial staleness) with
   the clock's hooks timed from inside (``schedule``, ``arrive``, ``close``), plus the staleness
   re-weighting of one teacher (M x N x C) timed alone, times the releases that needed it.

Usage: python benchmarks/async_overhead.py [--rounds 4] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from fdlit.configuration.schema import parse_fit
from fdlit.federation.clock.staleness import stale_teacher, staleness_weighted
from fdlit.methods import SmoothedUncertaintyWeighted
from fdlit.runs.experiment import Experiment

CLOCK = "fdlit.federation.clock."


def digits(rounds: int, *extra: str):
    args = ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--federation.rounds", str(rounds), *extra]
    parser, cfg = parse_fit(args)
    return Experiment(cfg, parser).loop


def clock_args(**init_args) -> list[str]:
    return ["--federation.clock", json.dumps({"class_path": CLOCK + "AsynchronousClock", "init_args": init_args})]


def cpu_of(loop) -> float:
    start = time.process_time()
    loop.fit()
    return time.process_time() - start


def time_hooks(clock, spent: list[float]) -> None:
    """Add up, in ``spent[0]``, the CPU seconds of the clock's round hooks (this instance only)."""
    for name in ("schedule", "arrive", "close"):
        hook = getattr(clock, name)

        def timed(*args, hook=hook):
            start = time.process_time()
            try:
                return hook(*args)
            finally:
                spent[0] += time.process_time() - start

        setattr(clock, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    equal = clock_args(profile={"class_path": CLOCK + "UniformProfile"},
                       staleness={"class_path": CLOCK + "Polynomial", "init_args": {"a": 0.5}})
    plain_s, clocked_s = [], []
    for _ in range(args.pairs):  # interleaved: the machine's load hits both alike
        plain_s.append(cpu_of(digits(args.rounds)))
        clocked_s.append(cpu_of(digits(args.rounds, *equal)))
    plain, clocked = statistics.median(plain_s), statistics.median(clocked_s)
    print(f"digits, {args.rounds} rounds, {args.pairs} interleaved pairs, CPU seconds (one torch thread)")
    print("| run | CPU s (median) | each |\n|---|---|---|")
    print(f"| no clock | {plain:.2f} | {', '.join(f'{v:.2f}' for v in plain_s)} |")
    print(f"| AsynchronousClock, equal devices, full buffer | {clocked:.2f} | {', '.join(f'{v:.2f}' for v in clocked_s)} |")
    print(f"pairs: (clocked - plain) / plain = {(clocked - plain) / plain:+.2%}")

    hetero = clock_args(profile={"class_path": CLOCK + "LogNormalProfile", "init_args": {"speed_sigma": 1.0}},
                        buffer=5, staleness={"class_path": CLOCK + "Polynomial", "init_args": {"a": 0.5}})
    loop = digits(args.rounds, *hetero)
    spent = [0.0]
    time_hooks(loop.clock, spent)
    total = cpu_of(loop)
    m, n, c = len(loop.parts.clients), len(loop.parts.tensors.public_x), loop.parts.num_classes
    z, w = torch.randn(m, n, c), torch.full((m, n), 1.0 / m)
    factors = torch.tensor([(s + 1) ** -0.5 for s in range(m)], dtype=torch.float64)
    start = time.process_time()
    for _ in range(20):
        stale_teacher(SmoothedUncertaintyWeighted(), staleness_weighted(w.double(), factors).float(), z)
    weighting = (time.process_time() - start) / 20 * max(args.rounds - 1, 0)
    share = (spent[0] + weighting) / total
    print(f"heterogeneous AsynchronousClock (log-normal, buffer 5, polynomial staleness): run {total:.2f} CPU s; "
          f"clock hooks {spent[0] * 1e3:.1f} ms, staleness re-weighting {weighting * 1e3:.1f} ms "
          f"({args.rounds - 1} releases of {m} x {n} x {c}): {share:.3%} of the run")


if __name__ == "__main__":
    main()
