"""How near fdlit's workloads come to this machine's limit: one core's fp32 GEMM peak and each
workload's share of it, fdlit beside plain loops, a stacked sweep beside its runs one after another.

    python benchmarks/machine_limit.py [--pairs 2] [--rounds 3] [--digits-rounds 5] [--sweep-rounds 3]
                                       [--parts step shares loops sweep] [--skip-reference]

Everything runs with one torch thread (``OMP_NUM_THREADS=1``), in fresh interpreters, CPU = user +
system seconds of the process and everything it started (start-up and data loading included).

1. Peak: the best GFLOP/s of ``torch.mm`` on square fp32 matrices (n = 512, 1024, 2048), one thread;
   and the stacked training step (grouped network, no vmap) against the vmapped one, in process.
2. Share of the peak: the Fashion-MNIST MLP run (``benchmarks/whole_run.py``'s FASHION_MLP setting,
   AVG, 784-200-10, 20 clients x 500 images) and the digits run (``configs/digits.yaml``) each run once
   in a child that counts the model FLOPs (``FlopCounterMode`` on one sample's forward: 3x that per
   trained sample, 1x per predicted one) and the CPU-seconds of training (``executor.train``) and
   evaluation (``executor.correct``); shares = FLOPs / CPU-s / peak, the whole run's over its whole
   CPU (imports and set-up included).
3. Ratios from interleaved pairs, one pair after another so that load hits both alike: fdlit against
   the plain PyTorch loop doing the same work (``benchmarks/plain_fd.py``), on digits also against the
   independent loop (``shared/reference/ref_fd.py`` beside the checkout or ``$FDLIT_REFERENCE``; its
   round 1 distils for as many epochs as it trains privately, 20, fdlit's 5), and the stacked sweep
   (``fdlit sweep sweeps/tau.yaml --stack``) against the same sweep's runs one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from whole_run import FASHION_MLP  # noqa: E402

PARTS = ("step", "shares", "loops", "sweep")
WORKLOADS = {"fashion_mlp": FASHION_MLP, "digits": ["--config", "configs/digits.yaml"]}
REFERENCE = Path(os.environ.get("FDLIT_REFERENCE", ROOT.parent / "shared" / "reference" / "ref_fd.py"))


def gemm_peak() -> float:
    """Best fp32 GFLOP/s of ``torch.mm`` on one thread."""
    import torch

    torch.set_num_threads(1)
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(2):
            torch.mm(a, b)
        repeats = max(3, int(2e10 / (2 * n**3)))
        start = time.process_time()
        for _ in range(repeats):
            torch.mm(a, b)
        best = max(best, 2 * n**3 * repeats / (time.process_time() - start) / 1e9)
    return best


def step_ratio(repeats: int = 5) -> list[float]:
    """CPU of the vectorized executor's private phase with the stacked step (grouped network, no
    vmap) over the same phase under vmap, Fashion-MNIST MLP shapes (20 clients x 400 images,
    784-200-10, Adam, batch 32, 2 epochs), interleaved; one ratio per repeat."""
    import torch
    from lightning.fabric import Fabric

    from fdlit.clients import ClientModule, ClientOptimization
    from fdlit.execution import VectorizedExecutor
    from fdlit.models import MLP

    torch.set_num_threads(1)
    fabric = Fabric(accelerator="cpu", devices=1)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(400, 1, 28, 28, generator=g), torch.randint(0, 10, (400,), generator=g)) for _ in range(20)]

    def phase_cpu(form: str) -> float:
        torch.manual_seed(0)
        clients = [ClientModule(MLP((1, 28, 28), 10, hidden=[200]), i, list(range(10)), ClientOptimization(), seed=1)
                   for i in range(20)]
        executor = VectorizedExecutor(conv_network=form)
        executor.setup(fabric, clients)
        executor.train(clients, "private", data, 1, 32)  # warm-up: the optimizer state, the grouped form
        start = time.process_time()
        executor.train(clients, "private", data, 2, 32)
        return time.process_time() - start

    return [phase_cpu("auto") / phase_cpu("vmap") for _ in range(repeats)]


def measure(cmd: list[str], env: dict[str, str]) -> float:
    """CPU-seconds of ``cmd`` and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def fit_flags(workload: str, rounds: int, run_dir: str) -> list[str]:
    return [*WORKLOADS[workload], "--federation.rounds", str(rounds), "--logger.mode", "disabled",
            "--logger.progress", "false", "--logger.run_dir", run_dir]


def child(workload: str, rounds: int) -> None:
    """One fdlit run in this process; prints its training and evaluation FLOPs and CPU-seconds (JSON)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    parser, cfg = parse_fit(fit_flags(workload, rounds, tempfile.mkdtemp()))
    experiment = Experiment(cfg, parser)
    experiment.setup()
    loop = experiment.loop
    executor = loop.settings.executor
    sample = loop.parts.tensors.test_x[:1]
    model = loop.view.clients[0].model
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.eval()
        model(sample)
        model.train()
    per_sample = float(counter.get_total_flops())
    spent = {"train": 0.0, "evaluation": 0.0, "inference": 0.0}
    flops = dict.fromkeys(spent, 0.0)
    from fdlit.execution import steps

    # evaluation is fdlit.execution.steps.correct: the executor's own ``correct`` where it has one
    correct = getattr(executor, "correct", None) or (
        lambda clients, x, y, rows=None: steps.predicted_correct(executor, clients, x, y, rows))
    train, predict = executor.train, executor.predict
    depth = [0]

    def timed_train(clients, phase, datasets, epochs, batch_size):
        start = time.process_time()
        out = train(clients, phase, datasets, epochs, batch_size)
        spent["train"] += time.process_time() - start
        flops["train"] += 3 * per_sample * epochs * sum(len(x) for x, _ in datasets)
        return out

    def timed_correct(clients, x, y, rows=None):
        start = time.process_time()
        depth[0] += 1
        try:
            out = correct(clients, x, y, rows)
        finally:
            depth[0] -= 1
        spent["evaluation"] += time.process_time() - start
        flops["evaluation"] += per_sample * len(clients) * (len(x) if rows is None else len(rows))
        return out

    def timed_predict(clients, x):
        start = time.process_time()
        out = predict(clients, x)
        if not depth[0]:  # public logits and the like; the evaluation's own predictions are counted above
            spent["inference"] += time.process_time() - start
            flops["inference"] += per_sample * len(clients) * len(x)
        return out

    executor.train, executor.correct, executor.predict = timed_train, timed_correct, timed_predict
    experiment.fit()
    print(json.dumps({"cpu": spent, "flops": flops}))


def share_of_peak(workload: str, rounds: int, env: dict[str, str], peak: float) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, __file__, "--child", workload, "--rounds", str(rounds)], cwd=ROOT,
                         env=env, check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    whole = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    inner = json.loads(out.strip().splitlines()[-1])
    cpu, flops = inner["cpu"], inner["flops"]
    gflops = lambda f, s: f / s / 1e9 if s else float("nan")  # noqa: E731
    return {"whole CPU-s": whole, "train CPU-s": cpu["train"], "eval CPU-s": cpu["evaluation"],
            "whole %": 100 * gflops(sum(flops.values()), whole) / peak,
            "train %": 100 * gflops(flops["train"], cpu["train"]) / peak,
            "eval %": 100 * gflops(flops["evaluation"], cpu["evaluation"]) / peak}


def ratio_pairs(name: str, commands: dict[str, list[str]], pairs: int, env: dict[str, str],
                compare: list[tuple[str, str]] | None = None) -> str:
    """Table rows 'a / b: median (range)' from interleaved pairs (every command once per pair);
    ``compare``: the (a, b) labels, default every command against the first."""
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    for pair in range(pairs):
        for label, cmd in commands.items():
            cpu[label].append(measure([c.replace("{pair}", str(pair)) for c in cmd], env))
    base = next(iter(commands))
    lines = []
    for a, b in compare or [(label, base) for label in list(commands)[1:]]:
        ratios = [x / y for x, y in zip(cpu[a], cpu[b], strict=True)]
        lines.append(f"| {name} | {a} / {b} | {statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} | "
                     f"{statistics.median(cpu[a]):.1f} / {statistics.median(cpu[b]):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="Fashion-MNIST MLP rounds")
    parser.add_argument("--digits-rounds", type=int, default=5)
    parser.add_argument("--sweep-rounds", type=int, default=3)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--child", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rounds)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "WANDB_SILENT": "true", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    peak = gemm_peak()
    print(f"load average before: {load} ({os.cpu_count()} CPUs); one torch thread")
    print(f"single-core fp32 GEMM peak (torch.mm): {peak:.1f} GFLOP/s")
    if "step" in args.parts:
        ratios = step_ratio()
        print(f"stacked step without vmap / vmapped step (Fashion-MNIST MLP private phase, CPU): "
              f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    if "shares" in args.parts:
        print("\n| workload | whole run CPU-s | share of peak: whole run | training | evaluation |\n|---|---|---|---|---|")
        for workload, rounds in (("fashion_mlp", args.rounds), ("digits", args.digits_rounds)):
            s = share_of_peak(workload, rounds, env, peak)
            print(f"| {workload}, {rounds} rounds | {s['whole CPU-s']:.1f} (training {s['train CPU-s']:.1f}, evaluation "
                  f"{s['eval CPU-s']:.1f}) | {s['whole %']:.0f} % | {s['train %']:.0f} % | {s['eval %']:.0f} % |", flush=True)
    print(f"\n| pair | ratio of CPU-s | median of {args.pairs} | range | CPU-s (median) |\n|---|---|---|---|---|")
    runs = tempfile.mkdtemp(prefix="fdlit-limit-")
    fit = [sys.executable, "-m", "fdlit", "fit"]
    plain = [sys.executable, "benchmarks/plain_fd.py"]
    if "loops" in args.parts:
        print(ratio_pairs(f"Fashion-MNIST MLP, {args.rounds} rounds", {
            "plain loop": [*plain, "--setting", "fashion_mlp", "--rounds", str(args.rounds)],
            "fdlit": [*fit, *fit_flags("fashion_mlp", args.rounds, runs)]}, args.pairs, env), flush=True)
        digits = {"plain loop": [*plain, "--rounds", str(args.digits_rounds)]}
        if not args.skip_reference and REFERENCE.is_file():
            digits["independent loop"] = [sys.executable, str(REFERENCE), "--agg", "avg", "--M", "20", "--k", "2",
                                          "--rounds", str(args.digits_rounds), "--e1", "20", "--e2", "5"]
        digits["fdlit"] = [*fit, *fit_flags("digits", args.digits_rounds, runs)]
        compare = [("fdlit", "plain loop")] + ([("fdlit", "independent loop")] if "independent loop" in digits else [])
        print(ratio_pairs(f"digits, {args.digits_rounds} rounds", digits, args.pairs, env, compare), flush=True)
    if "sweep" in args.parts:
        # a folder per command and pair: a sweep skips the runs it finds finished in its folder
        sweep = [sys.executable, "-m", "fdlit", "sweep", "sweeps/tau.yaml"]
        flags = ["--", f"--federation.rounds={args.sweep_rounds}", "--logger.mode=disabled", "--logger.progress=false"]
        print(ratio_pairs(f"sweeps/tau.yaml, {args.sweep_rounds} rounds", {
            "runs one after another": [*sweep, *flags, f"--logger.run_dir={runs}/separate{{pair}}"],
            "stacked": [*sweep, "--stack", *flags, f"--logger.run_dir={runs}/stacked{{pair}}"]}, args.pairs, env),
            flush=True)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
