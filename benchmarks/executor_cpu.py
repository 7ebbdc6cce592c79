"""CPU seconds of whole ``fdlit fit`` runs with one executor against another, as interleaved pairs.

    python benchmarks/executor_cpu.py [--config fashion_mnist.yaml] [--pairs 2]
        [--variants default sequential] [FIT FLAGS ...]

Each run is ``python -m fdlit fit --config CONFIG --logger.mode disabled FIT FLAGS`` plus the
variant's flags, in a fresh process with one thread (``OMP_NUM_THREADS=1``: torch's intra-op pool
takes its size from it). A pair runs every variant once, one after another; pairs repeat, so drift
on a shared machine hits every variant alike. The cost of a run is its process's CPU seconds
(user + system, ``resource.getrusage(RUSAGE_CHILDREN)``: start-up, data, every round), not wall
time. The table gives each variant's CPU seconds per pair and its ratio to the first variant in the
same pair, the median ratio, and the final mean accuracy (identical runs of one variant give one
accuracy: a check that the variants trained the same federation).

Variants (``VARIANTS``): ``default`` (the executor ``federation.executor: null`` chooses),
``sequential``, ``vectorized`` (grouped network for convolutional chains on a CPU) and
``vectorized-vmap`` (every stacked network under ``torch.func.vmap``).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

VARIANTS: dict[str, list[str]] = {
    "default": [],
    "sequential": ["--federation.executor", "fdlit.execution.SequentialExecutor"],
    "vectorized": ["--federation.executor", "fdlit.execution.VectorizedExecutor"],
    "vectorized-vmap": ["--federation.executor", "fdlit.execution.VectorizedExecutor",
                        "--federation.executor.conv_network", "vmap"],
}


def run(config: str, flags: list[str], run_dir: str) -> tuple[float, str]:
    """(CPU seconds of one ``fdlit fit`` process, its summary's best-accuracy line)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fdlit", "fit", "--config", config, "--logger.mode", "disabled",
           "--logger.run_dir", run_dir, *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = re.search(r"best mean global accuracy\s*:\s*([0-9.]+)", out.stdout + out.stderr)
    return cpu, found.group(1) if found else "?"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="fashion_mnist.yaml")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--variants", nargs="+", default=["default", "sequential"], choices=list(VARIANTS))
    args, fit_flags = p.parse_known_args()
    cpu: dict[str, list[float]] = {v: [] for v in args.variants}
    acc: dict[str, set[str]] = {v: set() for v in args.variants}
    with tempfile.TemporaryDirectory() as run_dir:
        for i in range(args.pairs):
            for v in args.variants:
                seconds, best = run(args.config, [*fit_flags, *VARIANTS[v]], run_dir)
                cpu[v].append(seconds)
                acc[v].add(best)
                print(f"pair {i + 1}: {v}: {seconds:.1f} CPU s, best accuracy {best}", file=sys.stderr, flush=True)
    base = args.variants[0]
    print(f"`{args.config}` {' '.join(fit_flags)}, one thread, {args.pairs} interleaved pairs")
    print("| variant | CPU s per pair | ratio to " + base + " per pair | median ratio | best accuracy |")
    print("|---|---|---|---|---|")
    for v in args.variants:
        ratios = [a / b for a, b in zip(cpu[v], cpu[base], strict=True)]
        print(f"| {v} | {', '.join(f'{s:.1f}' for s in cpu[v])} | {', '.join(f'{r:.2f}' for r in ratios)} "
              f"| {statistics.median(ratios):.2f} | {', '.join(sorted(acc[v]))} |")


if __name__ == "__main__":
    main()
