"""In-process ``fit`` vs ``deploy`` on digits: CPU seconds per round, peak memory, real vs analytic bytes.

Each run (``R2`` rounds) is a child process; its total CPU is the whole process tree's (this script
is made the subreaper of its descendants, so Flower's and fdlit's orphaned processes (node workers,
ClientApps) are reaped here and counted in ``RUSAGE_CHILDREN``); peak memory is the largest sum of
resident memory over every process of the run, sampled every 0.5 s (they share nothing but
libraries' pages, so the sum over-counts shared pages). CPU per round is what every process of the
run (the ``fit`` process; or the ``deploy`` command, the SuperLink, its SuperExec, the ServerApp, the
SuperNodes and their node workers) used between the end of round ``R1`` and of round ``R2`` (each
process's CPU read from /proc within 50 ms of the round's metrics line), over ``R2 - R1``:
start-up, set-up and teardown are left out, and it is split by kind of process. Each pair runs
``fit`` then ``deploy`` (the sequential executor on both sides, one torch thread a node worker).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/deployment.py --clients 20 --nodes 3 --rounds 2 6 --pairs 3
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


KINDS = (("superlink", ("fdlit.deployment.superlink", "flower-superlink")), ("superexec", ("superexec",)),
         ("serverapp", ("flwr-serverapp",)), ("supernode", ("fdlit.deployment.supernode", "flower-supernode")),
         ("node worker", ("fdlit.deployment.node",)), ("clientapp", ("flwr-clientapp",)))


def kind_of(cmdline: str) -> str:
    return next((kind for kind, names in KINDS if any(n in cmdline for n in names)), "command")


def marked(marker: bytes) -> dict[int, str]:
    """The processes whose environment holds ``marker``: pid -> kind."""
    out = {}
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            if marker in Path(environ).read_bytes():
                cmdline = Path(environ).with_name("cmdline").read_bytes().replace(b"\0", b" ")
                out[int(Path(environ).parent.name)] = kind_of(cmdline.decode(errors="replace"))
        except OSError:
            continue
    return out


def rss(pids) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def cpu_by_kind(pids: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user + system) so far of each process, summed by kind."""
    out: dict[str, float] = {}
    for pid, kind in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def measured(command: list[str], lines: str) -> dict:
    """Run ``command``; its CPU seconds (the whole tree), peak summed RSS, and each process kind's CPU as
    each line of the file ``lines`` (a glob) appeared: ``cpu_at_line[n]`` once it had n lines."""
    marker = f"FDLIT_MEASURE={uuid.uuid4().hex}".encode()
    env = {**os.environ, "FDLIT_MEASURE": marker.decode().split("=")[1], "WANDB_MODE": "disabled"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak, done = [0], threading.Event()
    at_line: dict[int, dict[str, float]] = {}

    def count() -> int:
        found = glob.glob(lines)
        return Path(found[0]).read_bytes().count(b"\n") if found else 0

    def sample():
        pids, seen, tick = {}, 0, 0
        while not done.is_set():
            n = count()
            if n > seen or tick % 10 == 0:
                pids = marked(marker)
                peak[0] = max(peak[0], rss(pids))
            if n > seen:  # a round ended: every process's CPU now
                at_line[n], seen = cpu_by_kind(pids), n
            tick += 1
            time.sleep(0.05)

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
    return {"cpu_s": cpu, "wall_s": wall, "peak_rss_mib": peak[0] / 2**20, "cpu_at_line": at_line}


def run(mode: str, clients: int, rounds: int, nodes: int, out: Path) -> dict:
    run_dir = out / f"{mode}-m{clients}-r{rounds}"
    k = max(2, -(-10 // clients))  # every class held by some client: 4 clients hold 3 classes each
    args = ["--config", "configs/digits.yaml", "--data.num_clients", str(clients), "--data.classes_per_client", str(k),
            "--federation.rounds", str(rounds),
            "--federation.executor", "fdlit.execution.SequentialExecutor", "--logger.progress", "false",
            "--logger.run_dir", str(run_dir)]
    command = [sys.executable, "-m", "fdlit", "fit", *args] if mode == "fit" else \
        [sys.executable, "-m", "fdlit", "deploy", "--nodes", str(nodes), "--threads", "1", *args]
    result = measured(command, str(run_dir / "*" / "metrics.jsonl"))
    metrics = [json.loads(line) for line in next(run_dir.glob("*/metrics.jsonl")).read_text().splitlines()]
    result["analytic_bytes"] = sum(m["comm/up_bytes"] + m["comm/down_bytes"] for m in metrics)
    result["wire_bytes"] = sum(m.get("comm/wire_up_bytes", 0) + m.get("comm/wire_down_bytes", 0) for m in metrics)
    result["wire_by_op"] = {k: sum(m.get(k, 0) for m in metrics) for k in sorted({k for m in metrics for k in m})
                            if k.startswith("comm/wire/")}
    result["final_acc"] = metrics[-1]["after_public/global_acc_mean"]
    result["metrics"] = metrics
    return result


def per_round(result: dict, r1: int, r2: int) -> dict:
    """CPU seconds a round between the end of round ``r1`` and of ``r2`` (their metrics lines), in all and
    by kind of process; for a deployment, the ServerApp's asks for replies and the Messages a round."""
    at = result["cpu_at_line"]  # a line that came within 50 ms of the one before: the later one's reading
    r1, r2 = (min(n for n in at if n >= r) for r in (r1, r2))
    a, b = at[r1], at[r2]
    by_kind = {k: round((b.get(k, 0.0) - a.get(k, 0.0)) / (r2 - r1), 3) for k in sorted(set(a) | set(b))}
    rounds = result["metrics"][r1:r2]
    return {"cpu_per_round_s": round(sum(b.values()) / (r2 - r1) - sum(a.values()) / (r2 - r1), 3),
            "cpu_per_round_by_process_s": by_kind,
            "pulls_per_round": sum(m.get("comm/pulls", 0) for m in rounds) / (r2 - r1),
            "messages_per_round": sum(m.get("comm/messages", 0) for m in rounds) / (r2 - r1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, nargs="+", default=[20])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, nargs=2, default=[2, 6])
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1)
    out = Path(args.out or tempfile.mkdtemp(prefix="fdlit-deploy-bench-"))
    r1, r2 = args.rounds
    for clients in args.clients:
        ratios = []
        for pair in range(args.pairs):
            rows = {}
            for mode in ("fit", "deploy"):  # interleaved: the machine's load changes over time
                load = os.getloadavg()[0]
                result = run(mode, clients, r2, args.nodes, out / f"{pair}")
                rows[mode] = {"clients": clients, "mode": mode, **per_round(result, r1, r2), "load_before": load,
                              **{k: result[k] for k in ("cpu_s", "wall_s", "peak_rss_mib", "analytic_bytes",
                                                        "wire_bytes", "wire_by_op", "final_acc")}}
                print(json.dumps(rows[mode]), flush=True)
            ratios.append(rows["deploy"]["cpu_per_round_s"] / rows["fit"]["cpu_per_round_s"])
            print(f"{clients} clients, rounds {r1 + 1}-{r2}: deploy / fit CPU a round "
                  f"{rows['deploy']['cpu_per_round_s']:.3f} / {rows['fit']['cpu_per_round_s']:.3f} s = "
                  f"{ratios[-1]:.2f}x (load average {os.getloadavg()[0]:.1f} after)", flush=True)
        print(f"{clients} clients: deploy / fit median {statistics.median(ratios):.2f}x of {len(ratios)} pairs "
              f"({', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
