"""Rounds per second of each client executor on digits, for M clients.

    python benchmarks/executors.py [--clients 5 20 100] [--rounds 3] [--repeats 3] [--model MLP]

Every (executor, M) run is a fresh subprocess of this script (``--worker``), so its peak memory
(VmHWM) is its own; runs are interleaved (repeat 1: every M x executor, repeat 2: ...) so drift on a
shared machine hits every variant alike. Round 1 is excluded (warm-up); the table gives the median
steady-state round time, rounds per second and the speed-up over the sequential executor measured
in this one run. The setting is the shipped digits config (MLP [128, 128], Adam, batch 32, 2
classes per client, 500 public samples) with 5 private and 5 public epochs per round.

To add an executor, add a line to ``EXECUTORS``: name -> (class_path, init_args, client options).
The last column gives the speed-up over plain ``sequential`` and over ``sequential-fused``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

EXECUTORS: dict[str, tuple[str, dict, dict]] = {  # name -> executor class, its args, client options
    "sequential": ("fdlit.execution.SequentialExecutor", {}, {}),
    # one client at a time with torch.optim's fused Adam (client.fused): the fastest sequential
    # setting, so the vectorized speed-up is also shown against it
    "sequential-fused": ("fdlit.execution.SequentialExecutor", {}, {"fused": True}),
    "vectorized": ("fdlit.execution.VectorizedExecutor", {}, {}),
    # actors hold the clients; round 1 (actor start-up) is excluded like every warm-up
    "ray": ("fdlit.execution.RayExecutor", {"num_cpus": 2}, {}),
}
EPOCHS = dict(private_epochs_first=5, private_epochs=5, public_epochs_first=5, public_epochs=5)


def _vm(key: str) -> float:
    """VmRSS / VmHWM of this process in MiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(args) -> None:
    warnings.filterwarnings("ignore")
    import importlib

    import torch

    from fdlit.callbacks import FederationCallback
    from fdlit.clients import ClientOptimization
    from fdlit.data import FederatedData
    from fdlit.federation import FederationLoop
    from fdlit.methods import ProbabilityAveraging

    module, _, cls = EXECUTORS[args.executor][0].rpartition(".")
    executor = getattr(importlib.import_module(module), cls)(**EXECUTORS[args.executor][1])
    stamps: list[float] = []

    class RoundClock(FederationCallback):
        def on_round_start(self, loop, round):
            if not stamps:
                stamps.append(time.perf_counter())

        def on_round_end(self, loop, round, metrics):
            stamps.append(time.perf_counter())

    loop = FederationLoop(
        rounds=args.rounds, **EPOCHS, executor=executor, callbacks=[RoundClock()], seed=args.seed,
        data=FederatedData(num_clients=args.clients_one, classes_per_client=2, public_size=500),
        model={"class_path": f"fdlit.models.{args.model}",
               "init_args": {"hidden": [128, 128]} if args.model == "MLP" else {}},
        client=ClientOptimization(optimizer="adam", lr=1e-3, batch_size=32, **EXECUTORS[args.executor][2]),
        aggregator=ProbabilityAveraging(),
    )
    rss_before = _vm("VmRSS")
    loop.fit()
    times = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    print(json.dumps({"times": times[1:], "first": times[0], "rss_before_mib": rss_before,
                      "peak_mib": _vm("VmHWM"), "acc": loop.history[-1]["after_public/global_acc_mean"],
                      "threads": torch.get_num_threads()}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, nargs="+", default=[5, 20, 100])
    p.add_argument("--executors", nargs="+", default=list(EXECUTORS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="MLP", choices=["MLP", "SmallCNN"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run_dir", default="/tmp/fdlit-bench-runs")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--executor", help=argparse.SUPPRESS)
    p.add_argument("--clients_one", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    results: dict[tuple[int, str], list[dict]] = {}
    for _ in range(args.repeats):  # interleaved: every (M, executor) once per repeat
        for m in args.clients:
            for name in args.executors:
                cmd = [sys.executable, __file__, "--worker", "--executor", name, "--clients_one", str(m),
                       "--rounds", str(args.rounds), "--model", args.model, "--seed", str(args.seed),
                       "--run_dir", args.run_dir]
                out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
                if out.returncode:
                    sys.exit(f"{name} M={m} failed:\n{out.stderr[-3000:]}")
                results.setdefault((m, name), []).append(json.loads(out.stdout.strip().splitlines()[-1]))

    any_run = next(iter(results.values()))[0]
    print(f"digits, {args.model}, torch threads={any_run['threads']}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, median of {args.repeats}x{args.rounds - 1} "
          f"steady-state rounds ({EPOCHS['private_epochs']} private + {EPOCHS['public_epochs']} public epochs)")
    print("| M | executor | s / round | rounds / s | speed-up vs sequential (vs sequential-fused) "
          "| peak RSS MiB (before fit) | final acc |")
    print("|---|---|---|---|---|---|---|")

    def median_time(m: int, name: str) -> float:
        runs = results.get((m, name))
        return statistics.median(t for r in runs for t in r["times"]) if runs else float("nan")

    for m in args.clients:
        base, base_fused = median_time(m, "sequential"), median_time(m, "sequential-fused")
        for name in args.executors:
            runs = results[(m, name)]
            med = median_time(m, name)
            peak = max(r["peak_mib"] for r in runs)
            before = statistics.median(r["rss_before_mib"] for r in runs)
            print(f"| {m} | {name} | {med:.3f} | {1 / med:.2f} | {base / med:.2f}x ({base_fused / med:.2f}x) "
                  f"| {peak:.0f} ({before:.0f}) | {runs[0]['acc']:.3f} |")


if __name__ == "__main__":
    main()
