"""The CIFAR-10 / ResNet-18 GPU suite: every case a ``fit`` of ``configs/cifar10.yaml`` (the paper's
setting: ResNet-18 CIFAR stem, Adam 1e-3, batch 128, k = 2, crop + flip) in a fresh process, within
its share of the suite's time budget (8 minutes of device time in all by default):

    python benchmarks/cifar10_gpu.py --suite [--out results.jsonl] [--budget_s 470] [--cases ...]

Cases (``--list`` prints them): the grouped round at M = 20 and 100; the same with the grouped step
captured as a CUDA graph (``federation.cuda_graphs``), with the fused Adam update inside the graph
or after it (``federation.executor.graph_optimizer``), with bf16 weights (``federation.precision
bf16-true``) and with evaluation batches of 1,024 (``federation.executor.eval_batch_size``); a
stacked sweep of 3 runs x 20 clients (3 seeds, ``fdlit sweep --stack``'s stacking); and one whole
paper run: round 1 with 20 + 20 epochs at the paper's 5,000 + 5,000 samples per client, then
2 + 2 epoch rounds, reported as measured and scaled to the paper's 50 rounds (measured whole run
time + the missing rounds at the measured later-round time).

Per case: round 1 and the median later round (s / round), TFLOP/s (model FLOPs of the round's
training, predictions and evaluations, ``torch.utils.flop_counter``) and % of the dense bf16 peak,
GPU utilisation (sampled every 0.2 s: ``torch.cuda.utilization``, else ``nvidia-smi``), peak GPU
memory after round 1. A case stopped at its share reports the rounds it finished. One JSON line per
case goes to ``--out`` as soon as the case ends; the table is printed at the end.

Data: ``--data_dir`` is a local copy of uoft-cs/cifar10; without it the cases run on random uint8
images of CIFAR-10's shape and split sizes (50,000 / 10,000), and the output says "synthetic": the
work per round does not depend on the pixels, the accuracies mean nothing.

``--dry-run`` (implies ``--device cpu --tiny``) runs every case's code path on a CPU in this process
at toy size (16x16 images, a few samples, the digits SmallCNN for ResNet-18, the grouped network forced, the CUDA-graph cases through the
same static step without the capture): what the test suite runs. The numbers then mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "cifar10.yaml")
PAPER_ROUNDS = 50
PREFIX = "SUITE "  # the worker's event lines on stdout
GRAPHS = ("--federation.cuda_graphs", "true")
# dense bf16 TFLOP/s by GPU name (first match; without sparsity)
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
               ("A100", 312.0), ("L40S", 362.0))


@dataclasses.dataclass
class Case:
    name: str
    what: str
    clients: int = 20
    runs: int = 1  # > 1: a stacked sweep (seeds 0, 1, ...)
    samples: int = 2000  # private samples per client (train + calibration)
    public: int = 2000
    rounds: int = 2  # round 1 is warm-up unless first_epochs says otherwise
    first_epochs: int = 2
    budget_s: float = 30.0  # its share of the suite's budget (scaled to what is left)
    flags: tuple[str, ...] = ()
    paper: bool = False


CASES = [
    Case("m20", "grouped round, M = 20, bf16 autocast", budget_s=35),
    Case("m20-graphs", "+ CUDA graph of the grouped step (Adam after each replay)",
         flags=(*GRAPHS, "--federation.executor.graph_optimizer", "false")),
    Case("m20-graphs-adam", "+ the fused Adam update inside the graph", flags=GRAPHS),
    Case("m20-graphs-bf16w", "+ bf16 weights, gradients, moments (bf16-true)",
         flags=(*GRAPHS, "--federation.precision", "bf16-true")),
    Case("m20-graphs-eval1024", "+ evaluation batches of 1,024",
         flags=(*GRAPHS, "--federation.executor.eval_batch_size", "1024")),
    Case("m100", "grouped round, M = 100", clients=100, samples=1000, public=1000, budget_s=50),
    Case("m100-graphs-adam", "M = 100, CUDA graph with Adam inside", clients=100, samples=1000, public=1000,
         budget_s=50, flags=GRAPHS),
    Case("sweep-3x20", "3 runs x 20 clients stacked in one grouped network", runs=3, budget_s=60),
    Case("paper", "configs/cifar10.yaml whole, round 1 with 20 + 20 epochs", samples=5000, public=5000, rounds=3,
         first_epochs=20, budget_s=170, paper=True),
]


def sized(case: Case, opts) -> Case:
    """``case`` with the options' sizes: the paper run's rounds; toy sizes with ``--tiny``."""
    case = dataclasses.replace(case, rounds=opts.paper_rounds if case.paper else case.rounds)
    if opts.tiny:  # every code path, no meaningful number
        case = dataclasses.replace(case, clients=min(case.clients, 5), samples=10, public=8,
                                   first_epochs=min(case.first_epochs, 2))
    return case


def fit_argv(case: Case, opts, seed: int, run_dir: str) -> list[str]:
    """The ``fit`` arguments of one run of ``case``."""
    graphs_by_hand = opts.device == "cpu" and set(GRAPHS) <= set(case.flags)
    flags = [f for f in case.flags if not (graphs_by_hand and f in GRAPHS)]  # refused on a CPU: set by hand
    argv = ["--config", CONFIG, "--seed", str(seed), "--data.num_clients", str(case.clients),
            "--data.samples_per_client", str(case.samples), "--data.public_size", str(case.public),
            "--federation.rounds", str(case.rounds), "--federation.private_epochs_first", str(case.first_epochs),
            "--federation.public_epochs_first", str(case.first_epochs), "--federation.accelerator", opts.device,
            "--federation.precision", opts.precision, "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", run_dir]
    argv += ["--data.data_dir", opts.data_dir] if opts.data_dir else ["--data.dataset", "cifar10-synthetic"]
    if not case.paper or opts.tiny:
        argv += ["--federation.executor", "fdlit.execution.VectorizedExecutor"]
    if not case.paper:
        argv += ["--checkpoint.every_n_rounds", "1000"]  # compute only (the last round still writes one)
    if opts.tiny:
        argv += ["--client.batch_size", "4", "--federation.executor.conv_network", "grouped",
                 "--model", "fdlit.models.SmallCNN", "--model.init_args.channels", "4", "--model.init_args.hidden", "16"]
    return argv + flags + (shlex.split(opts.paper_flags) if case.paper else [])


def worker(case: Case, opts, emit) -> None:
    """One case in this process; ``emit(event)`` as it goes (a case stopped at its time share still
    reports its finished rounds)."""
    warnings.filterwarnings("ignore")
    import torch
    from cifar10_measure import UtilisationSampler, round_flop, synthetic_cifar10

    from fdlit.callbacks import FederationCallback
    from fdlit.configuration.schema import parse_fit, rewrite_config_args
    from fdlit.data.datasets import DATASETS
    from fdlit.runs.experiment import Experiment
    from fdlit.sweeps.stack import stack_runs

    size = 16 if opts.tiny else 32
    train, test = (200, 16) if opts.tiny else (50000, 10000)
    DATASETS["cifar10-synthetic"] = lambda: synthetic_cifar10(train, test, size)
    cuda = opts.device == "cuda"
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    run_dir = os.path.join(opts.run_dir, f"{case.name}-{os.getpid()}")
    experiments = []
    for seed in range(case.runs):
        parser, cfg = parse_fit(rewrite_config_args(fit_argv(case, opts, seed, run_dir)))
        experiments.append(Experiment(cfg, parser))
        if opts.device == "cpu" and set(GRAPHS) <= set(case.flags):
            experiments[-1].loop.settings.executor.cuda_graphs = True  # the static step, uncaptured
    loop = experiments[0].loop
    sampler = UtilisationSampler() if cuda else None
    flop_args = argparse.Namespace(model="SmallCNN" if opts.tiny else "ResNet18", epochs=2, first_epochs=case.first_epochs, size=size)

    class RoundClock(FederationCallback):
        stamp = 0.0

        def on_round_start(self, view, round):
            if cuda:
                torch.cuda.synchronize()
            if round == 1:
                emit({"event": "start", "gpu": gpu, "torch": torch.__version__,
                      "flop": case.runs * round_flop(loop.data, flop_args),
                      "first_flop": case.runs * round_flop(loop.data, flop_args, first=True)})
            if sampler is not None:
                sampler.active.set()
                if round == 2:  # round 1 is warm-up
                    sampler.samples.clear()
                    torch.cuda.reset_peak_memory_stats()
            self.stamp = time.perf_counter()

        def on_round_end(self, view, round, metrics):
            if cuda:
                torch.cuda.synchronize()
            executor = getattr(loop.settings.executor, "inner", loop.settings.executor)
            emit({"event": "round", "round": round, "s": time.perf_counter() - self.stamp,
                  "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                  "util": sampler.mean() if sampler is not None and sampler.samples else None,
                  "forms": sorted(getattr(executor, "forms", ())), "executor": type(executor).__name__,
                  "static_client_phases": getattr(executor, "trained", {}).get("static", 0),
                  "acc": metrics.get("after_public/global_acc_mean")})

    loop.callbacks.insert(0, RoundClock())  # before the checkpointer: its write is not in the round
    start = time.perf_counter()
    if case.runs == 1:
        experiments[0].fit()
    else:
        outcomes = stack_runs(experiments, [f"seed{i}" for i in range(case.runs)], out=lambda line: None)
        failed = [o for o in outcomes if o["status"] != "finished"]
        if failed:
            raise RuntimeError(f"stacked run failed: {failed[0]['error']}")
    emit({"event": "done", "fit_s": time.perf_counter() - start})


def summarise(case: Case, events: list[dict], status: str, opts, whole_s: float | None) -> dict:
    """One JSON line of results from a case's events."""
    info = next((e for e in events if e["event"] == "start"), {})
    rounds = [e for e in events if e["event"] == "round"]
    row = {"case": case.name, "what": case.what, "status": status, "device": info.get("gpu", opts.device),
           "torch": info.get("torch"), "data": opts.data_dir or "synthetic (random CIFAR-10-shaped images)",
           "precision": opts.precision, "clients": case.clients, "runs": case.runs, "samples": case.samples,
           "public": case.public, "first_epochs": case.first_epochs, "flags": list(case.flags),
           "argv": fit_argv(case, opts, 0, opts.run_dir), "rounds_timed": len(rounds)}
    if not rounds:
        return row
    times = [e["s"] for e in rounds]
    later = times[1:]
    seconds = statistics.median(later) if later else times[0]
    flop = info["flop"] if later else info["first_flop"]
    peak = peak_of(opts, row["device"])
    utils = [e["util"] for e in rounds if e["util"] is not None]
    row.update(round1_s=times[0], s_per_round=seconds, timed=("rounds 2+" if later else "round 1 only"),
               tflops=flop / seconds / 1e12, pct_bf16_peak=100 * flop / seconds / 1e12 / peak, peak_tflops=peak,
               gpu_util=utils[-1] if utils else None, peak_gib=rounds[-1]["peak_gib"], forms=rounds[-1]["forms"],
               executor=rounds[-1]["executor"], acc=rounds[-1]["acc"],
               static_client_phases=rounds[-1]["static_client_phases"])
    fit = next((e["fit_s"] for e in events if e["event"] == "done"), None)
    if case.paper and fit is not None:
        row.update(fit_s=fit, whole_s=whole_s,
                   full_run_estimate_s=(whole_s or fit) + (PAPER_ROUNDS - case.rounds) * seconds)
    return row


def peak_of(opts, gpu: str) -> float:
    if opts.peak_tflops is not None:
        return opts.peak_tflops
    return next((tflops for name, tflops in PEAK_TFLOPS if name in gpu), 989.0)


def run_case(case: Case, opts, timeout: float) -> dict:
    """``case`` in a fresh process (in this one with ``--dry-run``), stopped after ``timeout`` s."""
    if opts.dry_run:
        events: list[dict] = []
        worker(case, opts, events.append)
        return summarise(case, events, "finished", opts, None)
    cmd = [sys.executable, __file__, "--worker", case.name, *opts.passed]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"),
                                                       os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        stdout, status = out.stdout, "finished"
        if out.returncode:
            status = "failed: " + (out.stderr.strip().splitlines() or ["?"])[-1][-300:]
    except subprocess.TimeoutExpired as stopped:
        stdout = stopped.stdout.decode() if isinstance(stopped.stdout, bytes) else (stopped.stdout or "")
        status = f"stopped at its share ({timeout:.0f} s)"
    whole = time.perf_counter() - start
    events = [json.loads(line[len(PREFIX):]) for line in stdout.splitlines() if line.startswith(PREFIX)]
    return summarise(case, events, status, opts, whole if status == "finished" else None)


def suite(opts) -> list[dict]:
    cases = [sized(c, opts) for c in CASES if not opts.cases or c.name in opts.cases]
    start, rows = time.perf_counter(), []
    data = opts.data_dir or "synthetic (random uint8 images of CIFAR-10's shape; accuracies mean nothing)"
    print(f"CIFAR-10 suite, data: {data}; {opts.precision}, {opts.device}; budget {opts.budget_s:.0f} s",
          flush=True)
    for k, case in enumerate(cases):
        left = opts.budget_s - (time.perf_counter() - start)
        if left < 15 and not opts.dry_run:
            row = {"case": case.name, "what": case.what, "status": "not run (suite budget spent)"}
        else:
            share = left * case.budget_s / sum(c.budget_s for c in cases[k:])
            row = run_case(case, opts, share)
        rows.append(row)
        with open(opts.out, "a") as f:  # as it ends: a suite stopped later keeps what it measured
            f.write(json.dumps(row) + "\n")
        print(f"{case.name}: {row['status']} ({time.perf_counter() - start:.0f} s into the suite)", flush=True)
    print_table(rows)
    return rows


def print_table(rows: list[dict]) -> None:
    def f(value, spec):
        return "–" if value is None else format(value, spec)

    first = next((r for r in rows if "device" in r), {})
    print(f"\ndevice: {first.get('device')}, torch {first.get('torch')}, data: {first.get('data')}")
    print("| case | what | M x runs | samples | round 1 s | s / round | TFLOP/s | % bf16 peak | GPU util % "
          "| peak GiB | timed | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['what']} | {r.get('clients', '')} x {r.get('runs', '')} "
              f"| {r.get('samples', '')}/{r.get('public', '')} | {f(r.get('round1_s'), '.1f')} "
              f"| {f(r.get('s_per_round'), '.2f')} | {f(r.get('tflops'), '.3g')} | {f(r.get('pct_bf16_peak'), '.3g')} "
              f"| {f(r.get('gpu_util'), '.0f')} | {f(r.get('peak_gib'), '.1f')} | {r.get('timed', '–')} "
              f"| {r['status']} |")
    for r in rows:
        if r.get("full_run_estimate_s") is not None:
            print(f"paper run: {r['rounds_timed']} rounds in {f(r.get('whole_s'), '.0f')} s whole "
                  f"({r['fit_s']:.0f} s in fit); {PAPER_ROUNDS} rounds ≈ {r['full_run_estimate_s'] / 60:.1f} min")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="CIFAR-10 / ResNet-18 GPU suite (benchmarks/cifar10_suite.py)")
    p.add_argument("--cases", nargs="+", choices=[c.name for c in CASES], help="default: all, in this order")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--out", default="cifar10_suite.jsonl", help="results, one JSON line per case (appended)")
    p.add_argument("--budget_s", type=float, default=470.0, help="seconds for every case together")
    p.add_argument("--paper_rounds", type=int, default=3, help="rounds of the whole paper run (paper: 50)")
    p.add_argument("--paper_flags", default="", help="fit flags for the paper run, e.g. '--federation.cuda_graphs true'")
    p.add_argument("--data_dir", default=None, help="local copy of uoft-cs/cifar10; default: synthetic")
    p.add_argument("--precision", default=None, help="default: bf16-mixed on CUDA, 32-true on a CPU")
    p.add_argument("--peak_tflops", type=float, default=None, help="dense bf16 peak (default: by GPU name)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="toy sizes (a functional run)")
    p.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help="every case's code path on a CPU, in this process, at toy size")
    p.add_argument("--run_dir", default="/tmp/fdlit-cifar10-suite")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parser().parse_args(argv)
    opts.passed = [a for i, a in enumerate(argv) if a != "--worker" and (i == 0 or argv[i - 1] != "--worker")]
    if opts.dry_run:
        opts.device, opts.tiny = "cpu", True
    opts.precision = opts.precision or ("bf16-mixed" if opts.device == "cuda" else "32-true")
    if opts.list:
        for c in CASES:
            print(f"{c.name}: {c.what} (M = {c.clients} x {c.runs}, {c.samples}/{c.public} samples)")
        return
    if opts.worker:
        case = sized(next(c for c in CASES if c.name == opts.worker), opts)
        return worker(case, opts, lambda event: print(PREFIX + json.dumps(event), flush=True))
    if opts.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("cifar10_suite: no CUDA device (--dry-run runs every case's code path on a CPU)")
    rows = suite(opts)
    if not any(r.get("rounds_timed") for r in rows):
        sys.exit("cifar10_suite: no case finished a round")


if __name__ == "__main__":
    main()
