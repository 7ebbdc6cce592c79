"""Every shipped digits config deployed on 3 local SuperNodes against ``fit``: same numbers or a reason.

    PYTHONPATH=$PWD python scripts/deploy_every_method.py [CONFIG ...] [--rounds 2] [--out results.json]

One local deployment (SuperLink and 3 fdlit SuperNodes on loopback) serves every run in turn; each config
runs ``rounds`` rounds with small settings (6 clients, 2 classes each, one epoch a phase) under ``deploy``
and under ``fit`` (sequential executor, one thread, on both sides), and every metric but ``time/*``,
``memory/*`` and the deployment's own ``comm/wire*``, ``comm/exchanges`` and ``nodes/*`` is compared
(floats within 1e-5, relative for values above 1). One line per config: equal, which metrics differ, or why it did not run.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

from fdlit.cli import main as cli_main
from fdlit.deployment.command import fit_arguments, run_on
from fdlit.deployment.launcher import LocalDeployment, flower_env

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMALL = ["--data.num_clients", "6", "--data.classes_per_client", "2", "--data.public_size", "120",
         "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
         "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
         "--federation.executor", "fdlit.execution.SequentialExecutor",
         "--logger.mode", "disabled", "--logger.progress", "false"]
DEPLOYMENT_ONLY = ("time/", "memory/", "comm/wire", "comm/exchanges", "nodes/")


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def close(v, w) -> bool:
    """Equal structure, floats within 1e-5 (relative above 1; NaN equals NaN)."""
    if isinstance(v, (list, tuple)) and isinstance(w, (list, tuple)):
        return len(v) == len(w) and all(close(a, b) for a, b in zip(v, w, strict=True))
    if isinstance(v, dict) and isinstance(w, dict):
        return v.keys() == w.keys() and all(close(v[k], w[k]) for k in v)
    if isinstance(v, float) and isinstance(w, float):
        return (math.isnan(v) and math.isnan(w)) or abs(v - w) <= 1e-5 * max(1.0, abs(v))
    return v == w


def differing(fitted: list[dict], deployed: list[dict]) -> list[str]:
    return sorted({k for f, d in zip(fitted, deployed, strict=True) for k, v in f.items()
                   if not k.startswith(DEPLOYMENT_ONLY) and not close(v, d.get(k))})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="*")
    parser.add_argument("--rounds", default="2")
    parser.add_argument("--out", default=None)
    a = parser.parse_args()
    configs = a.configs or sorted(p.name for p in CONFIGS.glob("digits*.yaml"))
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="fdlit-deploy-every-"))
    print(f"work folder: {work}", flush=True)
    deployment = LocalDeployment(3, work / "deploy")
    deployment.start()
    results = {}
    try:
        for config in configs:
            args = ["--config", config, "--federation.rounds", a.rounds, *SMALL]
            started = time.perf_counter()
            try:
                options = Namespace(nodes=3, timeout=300, node_wait=120.0, run_timeout=1800.0, threads=1,
                                    root_certificates=None)
                outcome = run_on(deployment.address, work / "deploy", flower_env(work / "deploy"), options,
                                 fit_arguments([*args, "--logger.run_dir", str(work / "deployed" / config)])[0])
                deployed_s = time.perf_counter() - started
                if outcome["status"] != "done":
                    results[config] = {"status": "failed", "why": str(outcome)[:300]}
                else:
                    assert cli_main(["fit", *args, "--logger.run_dir", str(work / "fit" / config)]) == 0
                    fitted = rows(next((work / "fit" / config).iterdir()))
                    deployed = rows(Path(outcome["run_dir"]))
                    diff = differing(fitted, deployed)
                    results[config] = {"status": "equal" if not diff else "differs", "differ": diff,
                                       "exchanges": [d.get("comm/exchanges") for d in deployed],
                                       "deploy_s": round(deployed_s, 1)}
            except Exception as exc:  # one config's failure is its line, the others go on
                results[config] = {"status": "error", "why": f"{type(exc).__name__}: {exc}"[:300]}
            r = results[config]
            print(f"{config:40s} {r['status']:8s} {r.get('exchanges', '')} {r.get('differ') or r.get('why') or ''}",
                  flush=True)
    finally:
        deployment.stop()
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    equal = sum(r["status"] == "equal" for r in results.values())
    print(f"{equal} of {len(results)} configs deployed with the numbers of fit")


if __name__ == "__main__":
    main()
