"""``python -m fdlit deploy [deploy options] --config X [fit flags]``: a ``fit`` run on Flower;
``deploy [deploy options] --resume RUN_DIR [--federation.rounds N ...]`` continues one.

Deploy options are listed in :func:`deploy_parser`; everything else is ``fit``'s arguments,
checked here (a ConfigError names the field) before any process starts.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
from pathlib import Path

from fdlit.errors import ConfigError


def deploy_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fdlit deploy", allow_abbrev=False, description="Run a fit config as a Flower federation. "
                                "Options not listed here are fit's (--config ..., --federation.rounds ...).")
    p.add_argument("--nodes", type=int, default=2, help="SuperNodes: started locally, or expected on --superlink")
    p.add_argument("--superlink", default=None, help="HOST:PORT of a running SuperLink (default: start one here)")
    p.add_argument("--root-certificates", default=None, help="CA certificate (PEM) of a TLS SuperLink")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take on a node")
    p.add_argument("--node-wait", type=float, default=120.0, help="seconds to wait for the SuperNodes to connect")
    p.add_argument("--run-timeout", type=float, default=7 * 24 * 3600.0, help="seconds the whole run may take")
    p.add_argument("--threads", type=int, default=0, help="torch threads per node worker (0: its default)")
    p.add_argument("--work-dir", default=None, help="keep Flower's files and logs here (default: a temporary folder)")
    return p


def fit_arguments(argv: list[str]):
    """fit's arguments with config files and the run folder made absolute (the ServerApp runs elsewhere),
    and the parsed config."""
    from fdlit.config import parse_fit, rewrite_config_args

    argv = rewrite_config_args(argv)
    argv = [str(Path(a).resolve()) if i > 0 and argv[i - 1] == "--config" else a for i, a in enumerate(argv)]
    parser, cfg = parse_fit(argv)
    run_dir = str(Path(cfg.logger.run_dir).resolve())
    return [*argv, f"--logger.run_dir={run_dir}"], parser, cfg


def main(run_dir: str | None, argv: list[str]) -> int:
    """``deploy``: ``run_dir`` is ``--resume``'s run directory (taken out of the arguments), or None."""
    from fdlit.deployment import import_flwr

    options, rest = deploy_parser().parse_known_args(argv)
    if options.nodes < 1:
        raise ConfigError("deploy --nodes", f"must be >= 1, got {options.nodes}")
    from fdlit.runs.experiment import Experiment, resume_experiment

    if run_dir is not None:  # continue a deployed (or fit) run from its checkpoint, on the nodes
        run_dir = str(Path(run_dir).resolve())
        resume_experiment(run_dir, rest)  # checks the run directory, its checkpoint and the flags
        fit_args = ["--resume", run_dir, *rest]
    else:
        fit_args, parser, cfg = fit_arguments(rest)
        Experiment(cfg, parser)  # the whole config checked before any process starts
    import_flwr()
    previous = signal.signal(signal.SIGTERM, interrupt)  # `kill` stops the deployment as Ctrl-C does
    try:
        return run(options, fit_args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupt(signum, frame):
    raise KeyboardInterrupt


def run(options, fit_args: list[str]) -> int:
    """Start (or reach) the deployment, run, print the summary; every local process stopped at the end."""
    from fdlit.deployment.launcher import LocalDeployment, flower_env, work_folder
    from fdlit.federation import format_summary
    from fdlit.runs.directory import read_summary

    with work_folder(options.work_dir) as work:
        env = flower_env(work)
        deployment: LocalDeployment | None = None
        try:
            if options.superlink is None:
                deployment = LocalDeployment(options.nodes, work)
                deployment.start()
            address = options.superlink or deployment.address
            outcome = run_on(address, work, env, options, fit_args)
        finally:
            if deployment is not None:
                deployment.stop()
    if outcome["status"] != "done":
        where = f"; run directory {outcome['run_dir']}" if outcome.get("run_dir") else ""
        print(f"fdlit deploy: the run failed: {outcome.get('error', 'unknown error')}{where}", file=sys.stderr)
        return 1
    if outcome.get("remote"):
        print("fdlit deploy: the run finished; its run directory is on the SuperLink's machine (logger.run_dir there)")
        return 0
    # summary.json writes NaN (e.g. FedAvg's teacher accuracy) as null
    summary = {k: math.nan if v is None else v for k, v in read_summary(Path(outcome["run_dir"])).items()}
    print(format_summary(summary))
    return 0


def run_on(address: str, work: Path, env: dict, options, fit_args: list[str]) -> dict:
    """Submit one fit run to the SuperLink at ``address`` and wait for its outcome (the ServerApp's
    result: status, run directory, error)."""
    from fdlit.deployment.launcher import stop_run, submit, wait_for_result, write_app, write_connection

    write_connection(env, address, options.root_certificates)
    result_file = work / "result.json"
    result_file.unlink(missing_ok=True)
    app = write_app(work / "app", {"fit-args": json.dumps(fit_args), "nodes": options.nodes,
                                   "timeout": float(options.timeout), "node-wait": float(options.node_wait),
                                   "threads": options.threads, "result-file": str(result_file)})
    run_id = submit(app, env)
    print(f"fdlit deploy: Flower run {run_id} on {address} with {options.nodes} SuperNodes", file=sys.stderr)
    try:
        return wait_for_result(result_file, run_id, env, options.run_timeout)
    except (KeyboardInterrupt, TimeoutError):
        stop_run(run_id, env)  # the SuperLink may outlive this process: do not leave the run going
        raise
