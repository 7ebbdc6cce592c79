"""Start-up cost of the command line: CPU seconds of ``python -m fdlit fit --help`` against
``python -c "import torch"`` (the floor: every fdlit command imports torch).

    python benchmarks/startup.py [--repeats 5] [--config configs/digits.yaml]

Each command runs ``--repeats`` times in a fresh interpreter, alternating, so that load on a shared
machine hits both alike; CPU = user + system seconds of the child (``os.wait4``), wall and peak RSS
beside it. The table gives the median of each and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(cmd: list[str]) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, peak RSS MiB) of one run of ``cmd``."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-500:]}")
    # ru_maxrss is KiB on Linux
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--config", default=None, help="also pass --config FILE before --help")
    args = parser.parse_args(argv)
    fit = [sys.executable, "-m", "fdlit", "fit"] + (["--config", args.config] if args.config else []) + ["--help"]
    commands = {"import torch": [sys.executable, "-c", "import torch"], "fdlit fit --help": fit}
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, cmd in commands.items():
            samples[name].append(measure(cmd))
    print(f"{'command':<20} {'CPU s':>7} {'wall s':>7} {'RSS MiB':>8}   (median of {args.repeats})")
    med = {}
    for name, rows in samples.items():
        cpu, wall, rss = (statistics.median(col) for col in zip(*rows, strict=True))
        med[name] = cpu
        print(f"{name:<20} {cpu:7.2f} {wall:7.2f} {rss:8.0f}")
    ratio = med["fdlit fit --help"] / med["import torch"]
    print(f"ratio (CPU, fit --help / import torch): {ratio:.2f}x")
    return {"ratio": ratio, **med}


if __name__ == "__main__":
    main()
