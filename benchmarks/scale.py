"""Scaling in the number of clients: time per round by component, and peak memory, on Fashion-MNIST.

    python benchmarks/scale.py [--clients 100 500 1000] [--rounds 2] [--threads 1] [--test_samples 1000]
        [--config fashion_mnist.yaml] [FIT FLAGS ...]

Each M runs the shipped Fashion-MNIST config (LeNet-5, Adam, k = 2, sUWA, the default executor:
vectorized) with 50 private samples per client, a 1,000-sample public set, no validation set and one
private and one public epoch per round (``SCALE_FLAGS``), through the same path as ``fdlit fit`` (run
directory, checkpoint; W&B disabled) in a fresh subprocess, so its peak RSS (VmHWM) is its own. Every
client is evaluated on a fixed, class-balanced ``--test_samples`` subset of the test set (the full
10,000 would make evaluation, not the federation, the measured cost at M = 1,000). Unknown flags are
passed to ``fit`` for every M, after ``SCALE_FLAGS`` (e.g. ``--data.public_size 500``); ``--config
digits.yaml --test_samples 0 --data.samples_per_client null --data.public_size 20`` is the digits setting
(digits has room for at most ~300 clients with 500 public samples). Components are timed by wrapping
the executor, the aggregator and the callbacks:

* train: private + public phases (``executor.train``);
* evaluate: test-set inference of every client after each phase, and the accuracies;
* public predict: every client's logits on the public set;
* uploads: the clients' method part (sUWA: calibration inference and the per-class Gaussian fit);
* aggregate: the server part (sUWA: the density of every public sample under every client's mixture);
* checkpoint: what ``checkpoint.pt`` costs the round: the snapshot of the state, plus the write and
  fsync when it is not in the background (``--checkpoint.background false``); the "write s" column
  is how long writing the file took (by default in a background thread, overlapping the next round);
* other: everything else in the round (run directory, ledger, metrics).

The table shows the last round, the share of the checkpoint, the checkpoint's size, the peak RSS, and
round 1 (with the default flags, rounds differ only in round 1's one-off costs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
import warnings
from collections import defaultdict

# the scale setting: >= 50 private samples per client, a 1,000-sample public set, 1 epoch per phase
SCALE_FLAGS = ["--data.samples_per_client", "50", "--data.public_size", "1000", "--data.validation_size", "0",
               "--federation.eval_subsample", "null", "--federation.private_epochs_first", "1",
               "--federation.private_epochs", "1", "--federation.public_epochs_first", "1",
               "--federation.public_epochs", "1"]
COMPONENTS = ("train", "evaluate", "public predict", "uploads", "aggregate", "checkpoint", "other")


def _vm(key: str) -> float:
    """VmRSS / VmHWM of this process in MiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _timed(seconds: dict, pick, fn):
    """``fn`` with its wall time added to ``seconds[pick(*args)]``."""
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[pick(*args, **kwargs)] += time.perf_counter() - t0
    return wrapper


def _evaluate_on_test_subset(n: int) -> None:
    """Every evaluation on a fixed, class-balanced ``n``-sample subset of the test set (set when the data
    is built, before the loop copies the test set to its device)."""
    import torch

    from fdlit.data.federated import FederatedData
    from fdlit.data.hub import _stratified_limit

    setup = FederatedData.setup

    def setup_with_test_subset(self, seed):
        setup(self, seed)
        keep = _stratified_limit(self.test.y.numpy(), n, self.num_classes)
        if keep is not None:
            self.test = self.test.subset(torch.from_numpy(keep), f"{self.test.name}[:{n}]")
        return self
    FederatedData.setup = setup_with_test_subset


def worker(args, fit_flags: list[str]) -> None:
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(args.threads)
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.checkpoint import Checkpointer
    from fdlit.runs.experiment import Experiment

    argv = ["--config", args.config, *(SCALE_FLAGS if args.config == "fashion_mnist.yaml" else []), "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", args.run_dir, "--federation.rounds", str(args.rounds),
            "--data.num_clients", str(args.clients_one), "--seed", str(args.seed), *fit_flags]
    parser, cfg = parse_fit(argv)
    experiment = Experiment(cfg, parser)
    if args.test_samples:
        _evaluate_on_test_subset(args.test_samples)
    experiment.setup()
    loop = experiment.loop
    rounds: list[dict] = []
    seconds: dict[str, float] = defaultdict(float)
    ex, agg = loop.settings.executor, loop.server_side.method
    ex.train = _timed(seconds, lambda *a, **k: "train", ex.train)
    ex.predict = _timed(seconds, lambda clients, x: "public predict" if x is loop.parts.tensors.public_x else "evaluate",
                        ex.predict)
    ex.client_hook = _timed(seconds, lambda *a, **k: "uploads", ex.client_hook)
    agg.aggregate = _timed(seconds, lambda *a, **k: "aggregate", agg.aggregate)
    # evaluate() = the two test-set predictions plus the accuracy arithmetic
    loop.parts = dataclasses.replace(loop.parts, evaluate=_timed(seconds, lambda *a, **k: "evaluate-all", loop.parts.evaluate))
    writes: list[float] = []  # seconds each checkpoint file took to write (in the background by default)
    for cb in loop.callbacks:
        name = "checkpoint" if isinstance(cb, Checkpointer) else "callbacks"
        cb.on_round_end = _timed(seconds, lambda *a, name=name, **k: name, cb.on_round_end)
        if isinstance(cb, Checkpointer) and hasattr(cb, "_write"):
            write = cb._write

            def timed_write(*a, write=write):
                t0 = time.perf_counter()
                write(*a)
                writes.append(time.perf_counter() - t0)
            cb._write = timed_write

    starts: list[float] = []

    def on_round_start(loop_, r):
        seconds.clear()
        starts.append(time.perf_counter())

    def on_round_end(loop_, r, metrics):  # the last callback: after the checkpoint
        total = time.perf_counter() - starts[-1]
        row = dict(seconds)
        # evaluate-all contains the test-set predict calls (also counted under "evaluate")
        row["evaluate"] = row.pop("evaluate-all", 0.0)
        row["other"] = total - sum(v for k, v in row.items() if k in COMPONENTS)
        rounds.append({"round": r, "total": total, **{k: row.get(k, 0.0) for k in COMPONENTS}})

    from fdlit.callbacks import FederationCallback

    class Clock(FederationCallback):
        pass

    first, last = Clock(), Clock()
    first.on_round_start = on_round_start
    last.on_round_end = on_round_end
    loop.callbacks = [first, *loop.callbacks, last]
    rss_before = _vm("VmRSS")
    loop.fit()
    ckpt = experiment.run_path / "checkpoint.pt"
    print(json.dumps({"rounds": rounds, "rss_before_mib": rss_before, "peak_mib": _vm("VmHWM"), "writes": writes,
                      "checkpoint_mib": ckpt.stat().st_size / 2**20 if ckpt.exists() else float("nan"),
                      "acc": loop.history[-1]["after_public/global_acc_mean"], "threads": torch.get_num_threads()}))


def main() -> None:
    p = argparse.ArgumentParser(epilog="Other flags are passed to `fdlit fit` for every M.")
    p.add_argument("--clients", type=int, nargs="+", default=[100, 500, 1000])
    p.add_argument("--config", default="fashion_mnist.yaml", help="fit config (the scale flags apply to fashion_mnist.yaml)")
    p.add_argument("--test_samples", type=int, default=1000, help="class-balanced test subset per evaluation; 0: all")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads in each worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run_dir", default="/tmp/fdlit-bench-scale")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--clients_one", type=int, help=argparse.SUPPRESS)
    args, fit_flags = p.parse_known_args()
    if args.worker:
        return worker(args, fit_flags)

    results = {}
    for m in args.clients:
        cmd = [sys.executable, __file__, "--worker", "--clients_one", str(m), "--rounds", str(args.rounds),
               "--threads", str(args.threads), "--seed", str(args.seed), "--run_dir", args.run_dir,
               "--config", args.config, "--test_samples", str(args.test_samples), *fit_flags]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "WANDB_MODE": "disabled"}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode:
            sys.exit(f"M={m} failed:\n{out.stderr[-3000:]}")
        results[m] = json.loads(out.stdout.strip().splitlines()[-1])

    any_run = next(iter(results.values()))
    print(f"{args.config} (+ the scale flags: 50 private samples per client, 1,000 public, 1 epoch per phase, "
          f"{args.test_samples or 'all'} test samples), default executor; torch threads={any_run['threads']}; round {args.rounds} of {args.rounds} (round 1 in the last column)"
          + (f"; fit flags: {' '.join(fit_flags)}" if fit_flags else ""))
    print("| M | round s | " + " | ".join(f"{c} s" for c in COMPONENTS)
          + " | checkpoint share | write s | checkpoint MiB | peak RSS MiB | round 1 s | final acc |")
    print("|" + "---|" * (len(COMPONENTS) + 8))
    for m, res in results.items():
        last, first = res["rounds"][-1], res["rounds"][0]
        cells = " | ".join(f"{last[c]:.3f}" for c in COMPONENTS)
        write = res["writes"][-1] if res["writes"] else float("nan")
        print(f"| {m} | {last['total']:.2f} | {cells} | {100 * last['checkpoint'] / last['total']:.1f} % "
              f"| {write:.3f} | {res['checkpoint_mib']:.1f} | {res['peak_mib']:.0f} | {first['total']:.2f} "
              f"| {res['acc']:.3f} |")


if __name__ == "__main__":
    main()
