"""CPU seconds W&B logging adds to one fdlit run, counted where they are spent.

    python benchmarks/wandb_cost.py [--repeats 3] [--rounds 20] [--config configs/digits.yaml]

Each repeat runs the config twice in fresh interpreters (one thread), W&B offline then disabled, and
counts what W&B adds directly rather than as the difference of two whole runs (on a shared machine
that difference is noisier than the cost itself):

* ``hooks``: CPU of the main thread inside the W&B callback (``import wandb``, ``wandb.init``, the
  per-round ``log`` calls with their heatmaps, the end-of-run table, summary and ``finish``);
* ``threads``: CPU of the run's other threads (wandb's in-process threads, and fdlit's background
  checkpoint writer, which the disabled run has alike: its figure is subtracted);
* ``service``: CPU of every process the run started (W&B's service and what it starts), waited for
  after ``wandb.teardown()`` (the run is their subreaper, so orphans are counted too).

W&B's cost = hooks + (threads - disabled run's threads) + (service - disabled run's service). The
whole-run difference (offline - disabled, CPU of the process and its children) is printed beside it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from whole_run import run_arguments

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import ctypes, json, os, resource, sys, tempfile, threading, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: W&B's orphans come here
from fdlit.configuration.schema import parse_fit
from fdlit.runs.experiment import Experiment
from fdlit.runs.wandb_logger import WandbLogger

hooks = [0.0]
def timed(method):
    def wrapper(self, *args, **kwargs):
        start = time.thread_time()
        try:
            return method(self, *args, **kwargs)
        finally:
            hooks[0] += time.thread_time() - start
    return wrapper
for name in ("on_fit_start", "on_round_end", "on_fit_end"):
    setattr(WandbLogger, name, timed(getattr(WandbLogger, name)))

config, rounds, mode = sys.argv[1:4]
parser, cfg = parse_fit(["--config", config, "--federation.rounds", rounds, "--logger.mode", mode,
                         "--logger.progress", "false", "--logger.run_dir", tempfile.mkdtemp()])
experiment = Experiment(cfg, parser)
experiment.run()
if "wandb" in sys.modules:  # the service outlives the run until teardown (else: at exit)
    start = time.thread_time()
    sys.modules["wandb"].teardown()
    hooks[0] += time.thread_time() - start
deadline = time.monotonic() + 60
while True:
    try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                raise SystemExit("a process the run started is still running after 60 s")
            time.sleep(0.05)
    except ChildProcessError:
        break
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
total = me.ru_utime + me.ru_stime
print("COST=" + json.dumps({"hooks": hooks[0], "threads": total - time.thread_time(), "process": total,
                            "service": kids.ru_utime + kids.ru_stime}))
"""


def run_once(config: str, rounds: int, mode: str) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WANDB_MODE", None)
    out = subprocess.run([sys.executable, "-c", CHILD, config, str(rounds), mode], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{config} ({mode}) failed: {out.stderr[-800:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("COST=")][-1]
    return json.loads(line[len("COST="):])


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = run_arguments(__doc__, argv)
    rows = []
    for _ in range(args.repeats):
        offline, disabled = (run_once(args.config, args.rounds, mode) for mode in ("offline", "disabled"))
        rows.append({
            "hooks": offline["hooks"],
            "threads": offline["threads"] - disabled["threads"],
            "service": offline["service"] - disabled["service"],
            "whole-run difference": (offline["process"] + offline["service"])
                                    - (disabled["process"] + disabled["service"]),
            "load": os.getloadavg()[0],
        })
        rows[-1]["W&B"] = rows[-1]["hooks"] + rows[-1]["threads"] + rows[-1]["service"]
    print(f"CPU s W&B adds to one run ({args.config}, {args.rounds} rounds, offline; median of {args.repeats}):")
    out = {}
    for key in ("W&B", "hooks", "threads", "service", "whole-run difference", "load"):
        values = [r[key] for r in rows]
        out[key] = statistics.median(values)
        print(f"  {key:<22} {out[key]:6.2f}   ({', '.join(f'{v:.2f}' for v in values)})")
    return out


if __name__ == "__main__":
    main()
