"""``deploy`` against ``fit`` round by round: wall time, the exchanges and what each took.

One local deployment (3 SuperNodes on loopback) runs the config, then ``fit`` runs it in this process,
each with the config's executor (add ``--federation.executor fdlit.execution.SequentialExecutor``
for the sequential one on both sides) and one torch thread; each round's line compares their
``time/round_s`` and shows the deployment's ``comm/exchanges``, ``time/exchange_s`` and node CPU, and
any metric (timings aside) on which the two differ by more than 1e-5; the last line gives the median
ratio over rounds 2 and later (round 1 holds the nodes' set-up).

    PYTHONPATH=$PWD python benchmarks/deployment_rounds.py configs/digits.yaml 16 [--checkpoint.every_n_rounds 10]

``--flower-superlink`` (first after the rounds): Flower's own ``flower-superlink`` instead of fdlit's
(fdlit.deployment.superlink), for the comparison in docs/deployment.md. The last line also gives the
SuperLink's CPU seconds over the whole deployment.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

import torch

from fdlit.cli import main as cli_main
from fdlit.deployment.command import fit_arguments, run_on
from fdlit.deployment.launcher import LocalDeployment, flower_env


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def main(config: str, rounds: str, extra: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="fdlit-deploy-bench-"))
    flower_superlink = extra[:1] == ["--flower-superlink"]
    extra = extra[1:] if flower_superlink else extra
    args = ["--config", config, "--federation.rounds", rounds, "--logger.mode", "disabled", "--logger.progress",
            "false", *extra]
    torch.set_num_threads(1)  # as the nodes' workers (threads=1)
    deployment = LocalDeployment(3, work / "deploy", flower_superlink=flower_superlink)
    deployment.start()
    try:
        options = Namespace(nodes=3, timeout=120, node_wait=120.0, run_timeout=3600.0, threads=1,
                            root_certificates=None)
        outcome = run_on(deployment.address, work / "deploy", flower_env(work / "deploy"), options,
                         fit_arguments([*args, "--logger.run_dir", str(work / "deployed")])[0])
        superlink_cpu_s = cpu_seconds(deployment.processes[0].pid)
    finally:
        deployment.stop()
    assert outcome["status"] == "done", outcome
    assert cli_main(["fit", *args, "--logger.run_dir", str(work / "fit")]) == 0
    fitted, deployed = rows(next((work / "fit").iterdir())), rows(Path(outcome["run_dir"]))
    print(f"{config} {' '.join(extra)}" + (" (Flower's SuperLink)" if flower_superlink else ""))
    ratios = [d["time/round_s"] / f["time/round_s"] for f, d in zip(fitted[1:], deployed[1:], strict=True)]
    for f, d in zip(fitted, deployed, strict=True):
        differ = [k for k, v in f.items() if not k.startswith(("time/", "memory/")) and isinstance(v, float)
                  and isinstance(d.get(k), float) and abs(v - d[k]) > 1e-5]
        print(f"round {d['round']}: fit {f['time/round_s']:.2f} s, deploy {d['time/round_s']:.2f} s "
              f"({d['time/round_s'] / f['time/round_s']:.1f}x); {d['comm/exchanges']} exchanges "
              f"{[round(x, 2) for x in d['time/exchange_s']]} s; nodes' CPU {d['time/nodes_cpu_s']:.2f} s; "
              f"up {d['comm/wire_up_bytes'] / 1e6:.2f} MB; metrics that differ: {differ or 'none'}")
    print(f"rounds 2-{len(deployed)}: deploy / fit median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x); the SuperLink's CPU {superlink_cpu_s:.1f} s "
          f"over {sum(r['time/round_s'] for r in deployed):.1f} s of rounds")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
