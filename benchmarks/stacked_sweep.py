"""CPU of a sweep run stacked (``fdlit sweep --stack``) against the same sweep run separately.

    python benchmarks/stacked_sweep.py [--sweep sweeps/tau.yaml] [--rounds 3] [--pairs 2] [-- extra fit flags]

Each pair runs, one after the other in fresh interpreters, ``fdlit sweep FILE`` (the runs one after
another in one process) and ``fdlit sweep FILE --stack``, each into a folder of its own, so that load
on a shared machine hits both alike (interleaved pairs). CPU = user + system seconds of the sweep
process and everything it started (``RUSAGE_CHILDREN``), start-up and data loading included; W&B
disabled, one torch thread (``OMP_NUM_THREADS=1``). After each pair every run's per-round metrics and
summary of the stacked sweep are compared with its separate run's (time metrics aside) and the
largest difference is printed. The table gives the median of each and the stacked / separate ratio
per pair, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("time/", "wall_time", "run_dir", "run", "setting")


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``cmd`` and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def runs_of(folder: Path) -> dict[str, tuple[list[dict], dict]]:
    """run name -> (metrics rows, summary) of every run directory in ``folder``."""
    out = {}
    for summary_path in folder.glob("*/summary.json"):
        d = summary_path.parent
        name = yaml.safe_load((d / "config.yaml").read_text())["logger"]["name"]
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        out[name] = (rows, json.loads(summary_path.read_text()))
    return out


def largest_difference(a, b, key="") -> float:
    """The largest absolute difference between two metric trees (inf where they differ otherwise)."""
    if any(key.rsplit("/", 1)[-1].startswith(t) or key.startswith(t) for t in TIMING):
        return 0.0
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return math.inf
        return max([largest_difference(a[k], b[k], k) for k in a], default=0.0)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return math.inf
        return max([largest_difference(x, y, key) for x, y in zip(a, b, strict=True)], default=0.0)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isnan(a) and math.isnan(b):
            return 0.0
        return abs(a - b)
    return 0.0 if a == b else math.inf


def compare(separate: Path, stacked: Path) -> float:
    a, b = runs_of(separate), runs_of(stacked)
    if set(a) != set(b) or not a:
        return math.inf
    return max(largest_difference(list(a[n]), list(b[n])) for n in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default="sweeps/tau.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=2)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "WANDB_SILENT": "true",
           "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    cpu = {"separate": [], "stacked": []}
    walls = {"separate": [], "stacked": []}
    diffs = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            folders = {}
            for kind in ("separate", "stacked"):
                folders[kind] = Path(tmp) / f"{kind}{pair}"
                cmd = [sys.executable, "-m", "fdlit", "sweep", args.sweep, *(["--stack"] if kind == "stacked" else []),
                       "--", f"--federation.rounds={args.rounds}", "--logger.mode=disabled",
                       "--logger.progress=false", f"--logger.run_dir={folders[kind]}", *extra]
                c, w = measure(cmd, env)
                cpu[kind].append(c)
                walls[kind].append(w)
                print(f"pair {pair + 1} {kind:>8}: {c:7.1f} CPU-s  {w:7.1f} s wall", flush=True)
            diffs.append(compare(folders["separate"], folders["stacked"]))
    ratios = [s / p for s, p in zip(cpu["stacked"], cpu["separate"], strict=True)]
    print(f"\n{args.sweep}, {args.rounds} rounds, {args.pairs} interleaved pairs, one torch thread")
    print("| | CPU-s (median) | wall s (median) |\n|---|---|---|")
    for kind in ("separate", "stacked"):
        print(f"| {kind} | {statistics.median(cpu[kind]):.1f} | {statistics.median(walls[kind]):.1f} |")
    print(f"stacked / separate CPU: {statistics.median(ratios):.3f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"largest metric difference stacked vs separate (time metrics aside): {max(diffs):.3g}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
