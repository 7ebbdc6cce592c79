"""In-process ``fit`` vs ``deploy`` on digits: CPU seconds per round, peak memory, real vs analytic bytes.

Each run is a child process; CPU is the whole process tree's (this script is made the subreaper of
its descendants, so Flower's and fdlit's orphaned processes (node workers, ClientApps) are reaped
here and counted in ``RUSAGE_CHILDREN``); peak memory is the largest sum of resident memory over
every process of the run, sampled every 0.2 s (they share nothing but libraries' pages, so the sum
over-counts shared pages). CPU per round is the difference between a run of ``R2`` and of ``R1``
rounds divided by ``R2 - R1``: start-up, set-up and teardown cancel out.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/deployment.py --clients 4 20 --nodes 4
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def tree_rss(marker: bytes) -> int:
    total = 0
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            if marker not in Path(environ).read_bytes():
                continue
            for line in Path(environ).with_name("status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def measured(command: list[str]) -> dict:
    """Run ``command``; its CPU seconds (the whole tree) and peak summed RSS."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "FDLIT_MEASURE": marker, "WANDB_MODE": "disabled"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(f"FDLIT_MEASURE={marker}".encode()))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = child.communicate()[0].decode(errors="replace")
    while True:  # reap orphaned descendants (node workers, ClientApps) re-parented to this process
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            break
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{output[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall, "peak_rss_mib": peak[0] / 2**20}


def run(mode: str, clients: int, rounds: int, nodes: int, out: Path) -> dict:
    run_dir = out / f"{mode}-m{clients}-r{rounds}"
    k = max(2, -(-10 // clients))  # every class held by some client: 4 clients hold 3 classes each
    args = ["--config", "configs/digits.yaml", "--data.num_clients", str(clients), "--data.classes_per_client", str(k),
            "--federation.rounds", str(rounds),
            "--federation.executor", "fdlit.execution.SequentialExecutor", "--logger.progress", "false",
            "--logger.run_dir", str(run_dir)]
    command = [sys.executable, "-m", "fdlit", "fit", *args] if mode == "fit" else \
        [sys.executable, "-m", "fdlit", "deploy", "--nodes", str(nodes), "--threads", "1", *args]
    result = measured(command)
    metrics = [json.loads(line) for line in next(run_dir.glob("*/metrics.jsonl")).read_text().splitlines()]
    result["analytic_bytes"] = sum(m["comm/up_bytes"] + m["comm/down_bytes"] for m in metrics)
    result["wire_bytes"] = sum(m.get("comm/wire_up_bytes", 0) + m.get("comm/wire_down_bytes", 0) for m in metrics)
    result["wire_by_op"] = {k: sum(m.get(k, 0) for m in metrics) for k in sorted({k for m in metrics for k in m})
                            if k.startswith("comm/wire/")}
    result["final_acc"] = metrics[-1]["after_public/global_acc_mean"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, nargs="+", default=[4, 20])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, nargs=2, default=[1, 3])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1)
    out = Path(args.out or tempfile.mkdtemp(prefix="fdlit-deploy-bench-"))
    r1, r2 = args.rounds
    rows = []
    for clients in args.clients:
        results = {}
        for rounds in (r1, r2):
            for mode in ("fit", "deploy"):  # interleaved: the machine's load changes over time
                results[(mode, rounds)] = run(mode, clients, rounds, args.nodes, out)
                print(clients, mode, rounds, json.dumps(results[(mode, rounds)]), flush=True)
        for mode in ("fit", "deploy"):
            a, b = results[(mode, r1)], results[(mode, r2)]
            rows.append({"clients": clients, "mode": mode, "cpu_per_round_s": (b["cpu_s"] - a["cpu_s"]) / (r2 - r1),
                         "cpu_total_s": b["cpu_s"], "wall_total_s": b["wall_s"], "peak_rss_mib": b["peak_rss_mib"],
                         "analytic_bytes": b["analytic_bytes"], "wire_bytes": b["wire_bytes"],
                         "wire_by_op": b["wire_by_op"], "final_acc": b["final_acc"]})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
