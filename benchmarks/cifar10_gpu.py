"""CIFAR-10 / ResNet-18, 20 clients: time per round, GPU utilisation and memory, per executor.

    python benchmarks/cifar10_gpu.py [--data_dir DIR] [--clients 20] [--rounds 3] [--repeats 1]
                                     [--executors sequential vectorized] [--precision 32-true]
                                     [--first_epochs 20] [--checkpoint] [--chunk_size N]
                                     [--channels_last] [--compile]

The setting of ``configs/cifar10.yaml`` (Kovalchuk et al. 2026, Table 2: ResNet-18 CIFAR stem, Adam 1e-3,
batch 128, 5,000 private samples per client, 5,000 public, k = 2, crop + flip on the device), with
``--epochs`` private + public epochs per round (the paper's 2) and ``--first_epochs`` in round 1
(the paper's 20; default: the same as ``--epochs``, so round 1 is only a warm-up). The table's
s / round is the median of rounds 2 and later; round 1 is reported apart.

``--checkpoint`` adds the run's checkpointer (format and background writer of ``fit``): the
table gives the time the training thread spends on it per round and the background write.
"% bf16 peak" is the model FLOPs of a round's training and inference steps (counted with
``torch.utils.flop_counter`` on one batch) per second, over the GPU's dense bf16 peak (``--peak_tflops``,
989 for an H100 SXM).

Data: ``--data_dir`` is a local copy of uoft-cs/cifar10 (as for ``fit``). Without it the script
uses random uint8 images of CIFAR-10's shape and split sizes (50,000 / 10,000): the work per round is
the same, the accuracies are meaningless, and the table says "synthetic".

Each executor runs in a fresh subprocess (``--worker``), so its peak memory is its own. GPU
utilisation is sampled every 0.2 s during the timed rounds (``torch.cuda.utilization``, which needs
``pynvml``, else ``nvidia-smi``). ``--device cpu`` with small ``--samples``/``--public`` runs the
same code on a CPU (used by the test suite; the numbers then mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import warnings

EXECUTORS = {
    "sequential": "fdlit.execution.SequentialExecutor",
    "vectorized": "fdlit.execution.VectorizedExecutor",
}
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def synthetic_cifar10(train: int, test: int):
    """Random uint8 images with CIFAR-10's shape, labels and input module (for timing only)."""
    from functools import partial

    import torch

    from fdlit.data.augment import ImageInput
    from fdlit.data.datasets import TensorDataset

    g = torch.Generator().manual_seed(0)
    transform = partial(ImageInput, mean=CIFAR10_MEAN, std=CIFAR10_STD, augment=True)
    out = []
    for n, name in ((train, "train"), (test, "test")):
        x = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
        y = torch.arange(n) % 10
        out.append(TensorDataset(x, y, 10, f"cifar10-synthetic/{name}", input_transform=transform))
    return out[0], out[1]


class UtilisationSampler:
    """Samples GPU utilisation (%) in a thread while ``active`` is set."""

    def __init__(self, device_index: int = 0, every: float = 0.2):
        self.samples: list[float] = []
        self.active = threading.Event()
        self._stop = threading.Event()
        self._read = self._reader(device_index)
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        if self._read is not None:
            self._thread.start()

    @staticmethod
    def _reader(index: int):
        import torch

        try:
            torch.cuda.utilization(index)
            return lambda: float(torch.cuda.utilization(index))
        except Exception:  # no pynvml
            pass
        if shutil.which("nvidia-smi"):
            cmd = ["nvidia-smi", "-i", str(index), "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
            return lambda: float(subprocess.run(cmd, capture_output=True, text=True).stdout.strip())
        return None

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            if self.active.is_set():
                with contextlib.suppress(Exception):  # a sample the tool could not give is skipped
                    self.samples.append(self._read())
            time.sleep(every)

    def mean(self) -> float:
        self._stop.set()
        return statistics.mean(self.samples) if self.samples else float("nan")


def step_flop(model_name: str, batch: int, train: bool) -> float:
    """Model FLOPs of one batch (forward, or forward + backward), counted on the meta device."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fdlit.models import ResNet18, SmallCNN

    with torch.device("meta"):
        shape = dict(input_shape=(3, 32, 32), num_classes=10)
        net = ResNet18(**shape, stem="cifar") if model_name == "ResNet18" else SmallCNN(**shape)
        x = torch.empty(batch, 3, 32, 32)
    with FlopCounterMode(display=False) as counter:
        out = net(x)
        if train:
            out.sum().backward()
    return float(counter.get_total_flops())


def round_flop(loop, args, first: bool = False) -> float:
    """Model FLOPs of one round: private and public training epochs, the public and calibration
    predictions, and the two evaluations on the test set (after each phase), for every client."""
    train, forward = step_flop(args.model, 1, True), step_flop(args.model, 1, False)
    data = loop.data
    private = sum(len(s.train) for s in data.clients)
    calibration = sum(len(s.calibration) for s in data.clients if s.calibration is not None)
    clients, public, test = len(data.clients), len(data.public), len(data.test)
    epochs = (args.first_epochs or args.epochs) if first else args.epochs
    return (epochs * (private + clients * public) * train
            + (clients * public + calibration + 2 * clients * test) * forward)


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
    executor = executor_class(chunk_size=args.chunk_size) if args.executor == "vectorized" else executor_class()
    cuda = args.device == "cuda"
    sampler = UtilisationSampler() if cuda else None
    stamps: list[float] = []

    class RoundClock(FederationCallback):
        def on_round_start(self, loop, round):
            if cuda:
                torch.cuda.synchronize()
            if not stamps:
                stamps.append(time.perf_counter())
            if round == 2 and sampler is not None:  # round 1 is warm-up
                sampler.active.set()
                torch.cuda.reset_peak_memory_stats()

        def on_round_end(self, loop, round, metrics):
            if cuda:
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            # as it happens, so a run stopped at its time limit still reports its finished rounds
            print(json.dumps({"round": round, "s": stamps[-1] - stamps[-2],
                              "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                              "chunk_size": getattr(loop.executor, "chunk_size", None),
                              "auto_chunks": sorted(set(getattr(loop.executor, "_auto_chunks", {}).values()))}),
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
    loop = FederationLoop(
        rounds=args.rounds, private_epochs_first=args.first_epochs or args.epochs, private_epochs=args.epochs,
        public_epochs_first=args.first_epochs or args.epochs, public_epochs=args.epochs, executor=executor,
        callbacks=callbacks, seed=0, accelerator=args.device, precision=args.precision,
        channels_last=args.channels_last, compile=args.compile,
        data=FederatedData(dataset=dataset, data_dir=args.data_dir, num_clients=args.clients_one,
                           classes_per_client=2, samples_per_client=args.samples, public_size=args.public),
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
        "times": times[1:], "first": times[0], "executor_used": type(loop.executor).__name__,
        "flop": round_flop(loop, args), "first_flop": round_flop(loop, args, first=True),
        "ckpt_blocking": checkpoint_times["blocking"], "ckpt_write": checkpoint_times["write"],
        "ckpt_mib": os.path.getsize(ckpt) / 2**20 if ckpt else float("nan"),
        "acc": loop.history[-1]["after_public/global_acc_mean"],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
        "util": sampler.mean() if sampler is not None else float("nan"),
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
    }))


def main() -> None:
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
    p.add_argument("--channels_last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--peak_tflops", type=float, default=989.0, help="dense bf16 peak of the GPU")
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
            sys.exit("cifar10_gpu.py: no CUDA device (use --device cpu for a functional run)")

    results: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for name in args.executors:
            cmd = [sys.executable, __file__, "--worker", "--executor", name, "--clients_one", str(args.clients)]
            for key in ("rounds", "epochs", "samples", "public", "train_size", "test_size", "batch_size",
                        "model", "precision", "device", "run_dir", "first_epochs", "chunk_size"):
                if getattr(args, key) is not None:
                    cmd += [f"--{key}", str(getattr(args, key))]
            cmd += [f"--{flag}" for flag in ("checkpoint", "channels_last", "compile") if getattr(args, flag)]
            if args.data_dir:
                cmd += ["--data_dir", args.data_dir]
            out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
            if out.returncode:  # the other executors still run and are reported
                print(f"{name} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
                continue
            results.setdefault(name, []).append(json.loads(out.stdout.strip().splitlines()[-1]))

    if not results:
        sys.exit("cifar10_gpu.py: every executor failed")
    first = next(iter(results.values()))[0]
    data = args.data_dir or f"synthetic ({args.train_size}/{args.test_size} random images)"
    print(f"CIFAR-10 {data}, {args.model}, {args.clients} clients, k=2, {args.samples} private / {args.public} "
          f"public, batch {args.batch_size}, {args.first_epochs or args.epochs}+{args.first_epochs or args.epochs} "
          f"epochs in round 1, {args.epochs}+{args.epochs} after, {args.precision}"
          f"{', channels-last' if args.channels_last else ''}{', compiled' if args.compile else ''}, "
          f"{first['gpu']}; median of {args.repeats}x{args.rounds - 1} rounds after round 1")
    print("| executor (used) | round 1 s | s / round | speed-up vs sequential | % bf16 peak | GPU util % "
          "| peak GPU memory GiB | checkpoint MiB | checkpoint s in round (write s) | final acc |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    med = {n: statistics.median(t for r in rs for t in r["times"]) for n, rs in results.items()}
    base = med.get("sequential", float("nan"))
    for name, runs in results.items():
        r0 = runs[0]
        peak = 100 * r0["flop"] / med[name] / (args.peak_tflops * 1e12)
        blocking = statistics.median(r0["ckpt_blocking"]) if r0["ckpt_blocking"] else float("nan")
        write = statistics.median(r0["ckpt_write"]) if r0["ckpt_write"] else float("nan")
        print(f"| {name} ({r0['executor_used']}) | {r0['first']:.1f} | {med[name]:.2f} | {base / med[name]:.2f}x "
              f"| {peak:.1f} | {statistics.mean(r['util'] for r in runs):.0f} "
              f"| {max(r['peak_gib'] for r in runs):.2f} | {r0['ckpt_mib']:.0f} | {blocking:.2f} ({write:.2f}) "
              f"| {r0['acc']:.3f} |")
    print(json.dumps({"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
