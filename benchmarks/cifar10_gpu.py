"""CIFAR-10 / ResNet-18 on one GPU: time per round, TFLOP/s, % of the dense bf16 peak, GPU utilisation
and memory, sequential vs vectorized (the grouped network). The suite (every case in a fresh
process, 8 minutes of device time in all; benchmarks/cifar10_suite.py, docs/gpu.md):

    python benchmarks/cifar10_gpu.py --suite [--out results.jsonl]

``--suite --dry-run`` runs every case's code path on a CPU at toy size.

One setting at a time (each executor in a fresh process):

    python benchmarks/cifar10_gpu.py [--data_dir DIR] [--clients 20] [--rounds 3] [--repeats 1]
                                     [--executors sequential vectorized] [--precision 32-true]
                                     [--first_epochs 20] [--checkpoint] [--chunk_size N]
                                     [--channels_last] [--compile] [--conv_network auto]

The setting of ``configs/cifar10.yaml`` (Kovalchuk et al. 2026, Table 2: ResNet-18 CIFAR stem, Adam 1e-3,
batch 128, 5,000 private samples per client, 5,000 public, k = 2, crop + flip on the device), with
``--epochs`` private + public epochs per round (the paper's 2) and ``--first_epochs`` in round 1
(the paper's 20; default: the same as ``--epochs``, so round 1 is only a warm-up). The table's
s / round is the median of rounds 2 and later; round 1 is reported apart (with ``--compile`` it holds
the compile time). With ``--precision bf16-mixed`` the vectorized executor's grouped network runs
with bf16 autocast and channels-last activations.

``--profile`` writes the kernel time by op over round 2 (``torch.profiler``, sorted by device time)
to ``--run_dir``; that round's time then includes the profiler's overhead.

``--checkpoint`` adds the run's checkpointer (format and background writer of ``fit``): the
table gives the time the training thread spends on it per round and the background write.
TFLOP/s is the model FLOPs of a round's training and inference steps (counted with
``torch.utils.flop_counter`` on one batch) per second; "% bf16 peak" divides it by the GPU's dense bf16
peak (``--peak_tflops``; by default from the GPU's name: 989 for an H100 SXM or H200).

Data: ``--data_dir`` is a local copy of uoft-cs/cifar10 (as for ``fit``). Without it the script
uses random uint8 images of CIFAR-10's shape and split sizes (50,000 / 10,000): the work per round is
the same, the accuracies are meaningless, and the table says "synthetic".

GPU utilisation is sampled every 0.2 s during the timed rounds (``torch.cuda.utilization``, which needs
``pynvml``, else ``nvidia-smi``). ``--device cpu`` with small ``--samples``/``--public`` runs the
same code on a CPU (used by the test suite; the numbers then mean nothing).
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

from cifar10_measure import UtilisationSampler, round_flop, synthetic_cifar10

EXECUTORS = {
    "sequential": "fdlit.execution.SequentialExecutor",
    "vectorized": "fdlit.execution.VectorizedExecutor",
}
# dense bf16 TFLOP/s by GPU name (first match; without sparsity)
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
               ("A100", 312.0), ("L40S", 362.0))


def worker(args) -> None:
    warnings.filterwarnings("ignore")
    import importlib

    import torch

    from fdlit.callbacks import FederationCallback
    from fdlit.clients import ClientOptimization
    from fdlit.data import FederatedData
    from fdlit.data.datasets import DATASETS
    from fdlit.federation import FederationLoop
    from fdlit.methods import SmoothedUncertaintyWeighted

    dataset = "cifar10"
    if args.data_dir is None:
        DATASETS["cifar10-synthetic"] = lambda: synthetic_cifar10(args.train_size, args.test_size)
        dataset = "cifar10-synthetic"
    module, _, cls = EXECUTORS[args.executor].rpartition(".")
    executor_class = getattr(importlib.import_module(module), cls)
    executor = (executor_class(chunk_size=args.chunk_size, conv_network=args.conv_network)
                if args.executor == "vectorized" else executor_class())
    cuda = args.device == "cuda"
    sampler = UtilisationSampler() if cuda else None
    stamps: list[float] = []
    gpu = torch.cuda.get_device_name() if cuda else "cpu"

    profiled: dict[str, str] = {}

    class RoundClock(FederationCallback):
        profiler = None

        def on_round_start(self, loop, round):
            if cuda:
                torch.cuda.synchronize()
            if args.profile and round == 2:  # kernel time by op over one whole round
                activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
                self.profiler = torch.profiler.profile(activities=activities)
                self.profiler.__enter__()
            if not stamps:
                stamps.append(time.perf_counter())
            if round == 1:  # what the parent needs if this process is stopped at its time limit
                print(json.dumps({"flop": round_flop(data, args), "first_flop": round_flop(data, args, first=True),
                                  "gpu": gpu}), file=sys.stderr, flush=True)
            if sampler is not None:
                sampler.active.set()
                if round == 2:  # round 1 is warm-up (its samples are kept only if no round 2 comes)
                    sampler.samples.clear()
                    torch.cuda.reset_peak_memory_stats()

        def on_round_end(self, loop, round, metrics):
            if cuda:
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            if self.profiler is not None:
                self.profiler.__exit__(None, None, None)
                table = self.profiler.key_averages().table(
                    sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=30)
                profiled["path"] = os.path.join(args.run_dir, f"profile-{args.executor}-{args.clients_one}.txt")
                os.makedirs(args.run_dir, exist_ok=True)
                with open(profiled["path"], "w") as f:
                    f.write(table)
                self.profiler = None
            # as it happens, so a run stopped at its time limit still reports its finished rounds
            print(json.dumps({"round": round, "s": stamps[-1] - stamps[-2],
                              "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                              "util": sampler.mean() if sampler is not None else None,
                              "forms": sorted(getattr(loop.executor, "forms", ())),
                              "profile": profiled.get("path"),
                              "chunk_size": getattr(loop.executor, "chunk_size", None),
                              "auto_chunks": sorted(set(getattr(loop.executor, "_auto_chunks",
                                                                {}).values()))}),
                  file=sys.stderr, flush=True)

    callbacks = [RoundClock()]
    checkpoint_times = {"blocking": [], "write": []}
    if args.checkpoint:
        from fdlit.runs.checkpoint import Checkpointer

        class TimedCheckpointer(Checkpointer):
            def on_round_end(self, loop, round, metrics):
                start = time.perf_counter()
                super().on_round_end(loop, round, metrics)
                checkpoint_times["blocking"].append(time.perf_counter() - start)

            def _write(self, state, round):
                start = time.perf_counter()
                super()._write(state, round)
                checkpoint_times["write"].append(time.perf_counter() - start)

        run_dir = os.path.join(args.run_dir, f"{args.executor}-{args.clients_one}-{os.getpid()}")
        os.makedirs(run_dir, exist_ok=True)
        callbacks.append(TimedCheckpointer(run_dir, {"benchmark": "cifar10_gpu"}))
    data = FederatedData(dataset=dataset, data_dir=args.data_dir, num_clients=args.clients_one,
                         classes_per_client=2, samples_per_client=args.samples, public_size=args.public)
    loop = FederationLoop(
        rounds=args.rounds, private_epochs_first=args.first_epochs or args.epochs, private_epochs=args.epochs,
        public_epochs_first=args.first_epochs or args.epochs, public_epochs=args.epochs, executor=executor,
        callbacks=callbacks, seed=0, accelerator=args.device, precision=args.precision,
        channels_last=args.channels_last, compile=args.compile,
        data=data,
        model={"class_path": f"fdlit.models.{args.model}",
               "init_args": {"stem": "cifar", "pretrained": False} if args.model == "ResNet18" else {}},
        client=ClientOptimization(optimizer="adam", lr=1e-3, batch_size=args.batch_size),
        aggregator=SmoothedUncertaintyWeighted(tau=0.25),
    )
    loop.fit()
    for callback in callbacks:
        if hasattr(callback, "wait"):
            callback.wait()
    times = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    ckpt = os.path.join(run_dir, "checkpoint.pt") if args.checkpoint else None
    print(json.dumps({
        "times": times[1:], "first": times[0], "executor_used": type(loop.settings.executor).__name__,
        "forms": sorted(getattr(loop.settings.executor, "forms", ())), "profile": profiled.get("path"),
        "flop": round_flop(data, args), "first_flop": round_flop(data, args, first=True),
        "ckpt_blocking": checkpoint_times["blocking"], "ckpt_write": checkpoint_times["write"],
        "ckpt_mib": os.path.getsize(ckpt) / 2**20 if ckpt else float("nan"),
        "acc": loop.history[-1]["after_public/global_acc_mean"],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
        "util": sampler.mean() if sampler is not None else float("nan"),
        "gpu": gpu,
    }))


def worker_command(args, name: str, clients: int, rounds: int) -> list[str]:
    cmd = [sys.executable, __file__, "--worker", "--executor", name, "--clients_one", str(clients),
           "--rounds", str(rounds)]
    for key in ("epochs", "samples", "public", "train_size", "test_size", "batch_size", "model", "precision",
                "device", "run_dir", "first_epochs", "chunk_size", "conv_network"):
        if getattr(args, key) is not None:
            cmd += [f"--{key}", str(getattr(args, key))]
    cmd += [f"--{flag}" for flag in ("checkpoint", "channels_last", "compile", "profile") if getattr(args, flag)]
    return cmd + (["--data_dir", args.data_dir] if args.data_dir else [])


def run_cell(args, name: str, clients: int, rounds: int, timeout: float | None = None) -> dict | None:
    """One executor in a fresh process; on a timeout, what its finished rounds reported."""
    try:
        out = subprocess.run(worker_command(args, name, clients, rounds), capture_output=True, text=True,
                             env=os.environ.copy(), timeout=timeout)
    except subprocess.TimeoutExpired as stopped:
        stderr = stopped.stderr.decode() if isinstance(stopped.stderr, bytes) else (stopped.stderr or "")
        lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        info = next((x for x in lines if "flop" in x), None)
        done = [x for x in lines if "round" in x]
        if info is None or not done:
            print(f"{name}, M={clients}: no round finished in {timeout:.0f} s", file=sys.stderr)
            return None
        util = done[-1]["util"]
        return {**info, "first": done[0]["s"], "times": [x["s"] for x in done[1:]], "forms": done[-1]["forms"], "profile": done[-1].get("profile"),
                "util": float("nan") if util is None else util, "executor_used": "stopped",
                "peak_gib": max((x["peak_gib"] or float("nan")) for x in done), "acc": float("nan"),
                "ckpt_blocking": [], "ckpt_write": [], "ckpt_mib": float("nan")}
    if out.returncode:  # the other cells still run and are reported
        print(f"{name}, M={clients} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_of(args, gpu: str) -> float:
    if args.peak_tflops is not None:
        return args.peak_tflops
    return next((tflops for name, tflops in PEAK_TFLOPS if name in gpu), 989.0)


def rate(r: dict, args) -> tuple[float, float, float]:
    """(s / round, TFLOP/s, % of the dense bf16 peak): rounds after round 1, else round 1 itself."""
    seconds = statistics.median(r["times"]) if r["times"] else r["first"]
    flop = r["flop"] if r["times"] else r["first_flop"]
    tflops = flop / seconds / 1e12
    return seconds, tflops, 100 * tflops / peak_of(args, r["gpu"])


def main() -> None:
    if "--suite" in sys.argv[1:]:  # the suite's own options (benchmarks/cifar10_suite.py --help)
        from cifar10_suite import main as suite_main

        return suite_main([a for a in sys.argv[1:] if a != "--suite"])
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--executors", nargs="+", default=list(EXECUTORS), choices=list(EXECUTORS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2, help="private and public epochs per round")
    p.add_argument("--data_dir", default=None, help="local copy of uoft-cs/cifar10; default: synthetic")
    p.add_argument("--samples", type=int, default=5000, help="private samples per client")
    p.add_argument("--public", type=int, default=5000)
    p.add_argument("--train_size", type=int, default=50000, help="synthetic train pool")
    p.add_argument("--test_size", type=int, default=10000, help="synthetic test split")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--model", default="ResNet18", choices=["ResNet18", "SmallCNN"])
    p.add_argument("--precision", default="32-true")
    p.add_argument("--first_epochs", type=int, default=None, help="epochs in round 1 (paper: 20)")
    p.add_argument("--checkpoint", action="store_true", help="write the run's checkpoint every round")
    p.add_argument("--chunk_size", type=int, default=None, help="vectorized: clients per stack")
    p.add_argument("--conv_network", default="auto", choices=["auto", "grouped", "vmap"],
                   help="vectorized: federation.executor.conv_network")
    p.add_argument("--channels_last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="kernel time by op over round 2, written to --run_dir (that round's time includes the profiler)")
    p.add_argument("--peak_tflops", type=float, default=None, help="dense bf16 peak of the GPU (default: by name)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--run_dir", default="/tmp/fdlit-bench-runs")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--executor", help=argparse.SUPPRESS)
    p.add_argument("--clients_one", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.rounds < 2:
        p.error("--rounds must be >= 2 (round 1 is warm-up)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("cifar10_gpu.py: no CUDA device (--suite --dry-run, or --device cpu, for a functional run)")

    results: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for name in args.executors:
            r = run_cell(args, name, args.clients, args.rounds)
            if r is not None:
                results.setdefault(name, []).append(r)

    if not results:
        sys.exit("cifar10_gpu.py: every executor failed")
    first = next(iter(results.values()))[0]
    data = args.data_dir or f"synthetic ({args.train_size}/{args.test_size} random images)"
    print(f"CIFAR-10 {data}, {args.model}, {args.clients} clients, k=2, {args.samples} private / {args.public} "
          f"public, batch {args.batch_size}, {args.first_epochs or args.epochs}+{args.first_epochs or args.epochs} "
          f"epochs in round 1, {args.epochs}+{args.epochs} after, {args.precision}"
          f"{', channels-last' if args.channels_last else ''}{', compiled' if args.compile else ''}, "
          f"{first['gpu']}; median of {args.repeats}x{args.rounds - 1} rounds after round 1")
    print("| executor (used, forms) | round 1 s | s / round | speed-up vs sequential | TFLOP/s | % bf16 peak "
          "| GPU util % | peak GPU memory GiB | checkpoint MiB | checkpoint s in round (write s) | final acc |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    med = {n: rate({**rs[0], "times": [t for r in rs for t in r["times"]]}, args) for n, rs in results.items()}
    base = med.get("sequential", (float("nan"),))[0]
    for name, runs in results.items():
        r0 = runs[0]
        seconds, tflops, peak = med[name]
        blocking = statistics.median(r0["ckpt_blocking"]) if r0["ckpt_blocking"] else float("nan")
        write = statistics.median(r0["ckpt_write"]) if r0["ckpt_write"] else float("nan")
        forms = f", {'/'.join(r0['forms'])}" if r0.get("forms") else ""
        print(f"| {name} ({r0['executor_used']}{forms}) | {r0['first']:.1f} | {seconds:.2f} | {base / seconds:.2f}x "
              f"| {tflops:.3g} | {peak:.3g} | {statistics.mean(r['util'] for r in runs):.0f} "
              f"| {max(r['peak_gib'] for r in runs):.2f} | {r0['ckpt_mib']:.0f} | {blocking:.2f} ({write:.2f}) "
              f"| {r0['acc']:.3f} |")
    for name, runs in results.items():
        if runs[0].get("profile"):
            print(f"{name}: kernel time by op over round 2 in {runs[0]['profile']}")
    print(json.dumps({"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
