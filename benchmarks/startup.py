"""Start-up cost of the command line: CPU seconds of fdlit's commands that end before any training
(help, refusals, an export) and of the imports a digits run makes before its first round, each
against ``python -c "import torch"`` (the floor: every fdlit command imports torch).

    python benchmarks/startup.py [--repeats 5] [--before DIR]

Each command runs ``--repeats`` times in a fresh interpreter, all commands alternating, so that load
on a shared machine hits them alike; CPU = user + system seconds of the child (``os.wait4``), wall
and peak RSS beside it. The table gives the median of each and its ratio to ``import torch``'s
median. ``--before DIR`` runs every fdlit command from another checkout too (e.g. a git worktree of
an older commit), interleaved, as ``<command> [before]``. The refusals use ``HF_HUB_OFFLINE=1`` and
an empty Hugging Face home, so "a dataset that cannot be had offline" is refused on any machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a one-round digits run that writes, at its end, every module it imported (in import order)
RUN_AND_LIST = """
import runpy, sys
out, sys.argv = sys.argv[1], ["fdlit", *sys.argv[2:]]
try:
    runpy.run_module("fdlit", run_name="__main__")
finally:
    with open(out, "w") as f:
        f.write("\\n".join(m for m in list(sys.modules) if m != "__main__"))
"""
# the same modules imported, nothing else run: what `fit` imports before it trains. sys.modules lists
# a module when its import completes (a package after its submodules), so fdlit's own modules go first,
# from the command line down, as in the run; they import the rest as the run did
IMPORT_LISTED = """
import importlib, sys
names = open(sys.argv[1]).read().split()
for name in ["fdlit.cli"] + [n for n in names if n.startswith("fdlit")] + names:
    try:
        importlib.import_module(name)
    except Exception:
        pass
"""


def commands(run_dir: str, modules: str) -> dict[str, list[str]]:
    fdlit = [sys.executable, "-m", "fdlit"]
    return {
        "import torch": [sys.executable, "-c", "import torch"],
        "fit's imports (digits)": [sys.executable, "-c", IMPORT_LISTED, modules],
        "fit --help": [*fdlit, "fit", "--help"],
        "fit: knob refused": [*fdlit, "fit", "--config", "configs/digits.yaml", "--data.num_clients", "0"],
        "fit: offline dataset refused": [*fdlit, "fit", "--config", "configs/cifar10.yaml"],
        "deploy: --threads refused": [*fdlit, "deploy", "--config", "configs/digits.yaml", "--threads", "-3"],
        "export (digits MLP)": [*fdlit, "export", run_dir, "--client", "0", "--out",
                                str(Path(tempfile.mkdtemp()) / "m.pt")],
    }


def measure(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, peak RSS MiB) of one run of ``cmd``; exit 0 or 2 (a refusal)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-500:]}")
    # ru_maxrss is KiB on Linux
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def digits_run(folder: str, cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """A one-round digits run to export from, and the file listing the modules it imported."""
    modules = str(Path(folder) / "modules.txt")
    subprocess.run([sys.executable, "-c", RUN_AND_LIST, modules, "fit", "--config", "configs/digits.yaml",
                    "--federation.rounds", "1", "--logger.mode", "disabled", "--logger.progress", "false",
                    "--logger.run_dir", str(Path(folder) / "runs")], cwd=cwd, env={**env, "PYTHONPATH": str(cwd)},
                   check=True, capture_output=True)
    return str(next((Path(folder) / "runs").iterdir())), modules


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", type=Path, default=None, help="another checkout whose fdlit also runs each command")
    args = parser.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": tempfile.mkdtemp(),
           "WANDB_MODE": "disabled"}
    todo = {name: (cmd, ROOT) for name, cmd in commands(*digits_run(tempfile.mkdtemp(), ROOT, env)).items()}
    if args.before is not None:
        before = args.before.resolve()
        for name, cmd in commands(*digits_run(tempfile.mkdtemp(), before, env)).items():
            if name != "import torch":
                todo[f"{name} [before]"] = (cmd, before)
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in todo}
    for _ in range(args.repeats):
        for name, (cmd, cwd) in todo.items():
            samples[name].append(measure(cmd, {**env, "PYTHONPATH": str(cwd)}, cwd))
    print(f"{'command':<38} {'CPU s':>7} {'x torch':>8} {'wall s':>7} {'RSS MiB':>8}   "
          f"(median of {args.repeats}; load average {os.getloadavg()[0]:.1f})")
    med = {name: statistics.median(r[0] for r in rows) for name, rows in samples.items()}
    for name, rows in samples.items():
        wall, rss = (statistics.median(r[i] for r in rows) for i in (1, 2))
        print(f"{name:<38} {med[name]:7.2f} {med[name] / med['import torch']:7.2f}x {wall:7.2f} {rss:8.0f}")
    return {name: cpu / med["import torch"] for name, cpu in med.items()}


if __name__ == "__main__":
    main()
