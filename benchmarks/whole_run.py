"""Whole-run CPU of fdlit against a plain PyTorch FD loop on the same work, start-up included.

    python benchmarks/whole_run.py [--repeats 3] [--rounds 20] [--config configs/digits.yaml]
    python benchmarks/whole_run.py --setting fashion_mlp [--repeats 3] [--rounds 3]
    python benchmarks/whole_run.py --setting fashion_lenet [--repeats 3] [--rounds 3]

``--setting digits`` (the default) and ``fashion_mlp`` compare ``fdlit fit`` with the plain loop of
benchmarks/plain_fd.py doing the same run (``fashion_mlp``: fdlit with the flags in FASHION_MLP, AVG,
W&B disabled besides offline); ``fashion_lenet`` compares ``configs/fashion_mnist.yaml`` under fdlit's
default executor with the same run under the sequential executor (both W&B disabled).

Each repeat runs, one after another in fresh interpreters: the plain loop (benchmarks/plain_fd.py),
``fdlit fit`` with W&B offline and ``fdlit fit`` with W&B disabled, so that load on a shared
machine hits all three alike (paired, interleaved). CPU = user + system seconds of the process and
of every process it started, W&B's service included (this script is their subreaper, so orphans
are waited for here and counted). Threads are pinned to one
(``OMP_NUM_THREADS=1``) for all three. The table gives the median of each and the ratio of
fdlit to the plain loop per repeat (median and range).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def become_subreaper() -> None:
    """Processes orphaned below this one (W&B's service outlives ``fdlit``) become its children, so
    that their CPU is counted when they are waited for (Linux ``PR_SET_CHILD_SUBREAPER``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def measure(cmd: list[str], env: dict[str, str], linger_s: float = 60.0, cwd: Path = ROOT) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``cmd`` and every process it started, also those that
    outlived it (waited for up to ``linger_s``), from ``RUSAGE_CHILDREN``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read().decode()
    code = proc.wait()
    wall = time.perf_counter() - start
    deadline = time.monotonic() + linger_s
    while True:  # reap the orphans (reparented here); none left: ChildProcessError
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"a process started by {cmd[:4]} is still running after {linger_s:g} s")
            time.sleep(0.05)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err[-800:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def run_arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """``--repeats``, ``--rounds`` and ``--config``: what a whole-run benchmark varies."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=None, help="default: 20 for digits, 3 for Fashion-MNIST")
    parser.add_argument("--config", default="configs/digits.yaml")
    parser.add_argument("--setting", choices=("digits", "fashion_mlp", "fashion_lenet"), default="digits")
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout of fdlit (e.g. a git worktree of an older commit): its fdlit runs every "
                             "fdlit command too, interleaved, as '<command> [before]'")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (20 if args.setting == "digits" else 3)
    return args


# the plain loop's fashion_mlp setting (benchmarks/plain_fd.py) as fdlit flags
FASHION_MLP = [
    "--config", "configs/datasets/fashion_mnist.yaml", "--config", "configs/methods/avg.yaml",
    "--model", "fdlit.models.MLP", "--model.init_args.hidden", "[200]", "--data.samples_per_client", "500",
    "--data.validation_size", "0", "--client.batch_size", "32", "--client.public_batch_size", "64",
    "--federation.private_epochs_first", "10", "--federation.private_epochs", "2",
    "--federation.public_epochs_first", "5", "--federation.public_epochs", "2", "--federation.eval_subsample", "2000",
]


def setting_commands(args: argparse.Namespace, runs: str) -> dict[str, list[str]]:
    """The commands one repeat runs, the baseline first."""
    fit = [sys.executable, "-m", "fdlit", "fit", "--federation.rounds", str(args.rounds), "--logger.progress", "false",
           "--logger.run_dir", runs]
    plain = [sys.executable, "benchmarks/plain_fd.py", "--rounds", str(args.rounds)]
    if args.setting == "fashion_lenet":
        fit += ["--config", "configs/fashion_mnist.yaml", "--logger.mode", "disabled"]
        return {"fdlit, sequential executor": fit + ["--federation.executor", "fdlit.execution.SequentialExecutor"],
                "fdlit, default executor": fit}
    if args.setting == "fashion_mlp":
        fit, plain = fit + FASHION_MLP, plain + ["--setting", "fashion_mlp"]
    else:
        fit += ["--config", args.config]
    return {"plain PyTorch loop": plain, "fdlit, W&B offline": fit + ["--logger.mode", "offline"],
            "fdlit, W&B disabled": fit + ["--logger.mode", "disabled"]}


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = run_arguments(__doc__, argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WANDB_MODE", None)
    become_subreaper()
    runs = tempfile.mkdtemp(prefix="fdlit-whole-run-")
    commands = setting_commands(args, runs)
    where = {name: ROOT for name in commands}
    if args.before is not None:  # the same fdlit commands from the other checkout (its folder as cwd: -m finds it)
        for name, cmd in list(commands.items()):
            if "fdlit" in cmd:
                commands[f"{name} [before]"], where[f"{name} [before]"] = cmd, args.before.resolve()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, cmd in commands.items():
            samples[name].append(measure(cmd, {**env, "PYTHONPATH": str(where[name])}, cwd=where[name]))
    what = args.config if args.setting == "digits" else args.setting
    print(f"{'command':<27} {'CPU s':>7} {'wall s':>7}   (median of {args.repeats}, {args.rounds} rounds, "
          f"{what}; one thread each; load average {os.getloadavg()[0]:.1f})")
    med = {}
    for name, rows in samples.items():
        cpu, wall = (statistics.median(col) for col in zip(*rows, strict=True))
        med[name] = cpu
        print(f"{name:<27} {cpu:7.2f} {wall:7.2f}")
    base = next(iter(commands))
    plain = [cpu for cpu, _ in samples[base]]
    out = {}
    for name in list(commands)[1:]:
        ratios = [cpu / p for (cpu, _), p in zip(samples[name], plain, strict=True)]
        out[name] = statistics.median(ratios)
        print(f"ratio {name} / {base} (CPU, paired): {out[name]:.2f}x  (range {min(ratios):.2f}-{max(ratios):.2f})")
    return out


if __name__ == "__main__":
    main()
