"""``python -m fdlit deploy [deploy options] --config X [fit flags]``: a ``fit`` run on Flower;
``deploy [deploy options] --resume RUN_DIR [--federation.rounds N ...]`` continues one.

Deploy options are listed in :func:`deploy_parser`; everything else is ``fit``'s arguments,
checked here (a ConfigError names the field) before any process starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
from pathlib import Path

from fdlit.errors import ConfigError

NODE_CHECKPOINTS = ".fdlit-node-checkpoints"  # under logger.run_dir: where local nodes save their clients' states


def deploy_parser() -> argparse.ArgumentParser:
    from fdlit.deployment.checks import OptionParser

    p = OptionParser(prog="fdlit deploy", allow_abbrev=False, description="Run a fit config as a Flower federation. "
                     "Options not listed here are fit's (--config ..., --federation.rounds ...).")
    p.add_argument("--nodes", type=int, default=2, help="SuperNodes: started locally, or expected on --superlink "
                   "(1..data.num_clients)")
    p.add_argument("--superlink", default=None, help="HOST:PORT of a running SuperLink (default: start one here)")
    p.add_argument("--root-certificates", default=None, help="CA certificate (PEM) of a TLS SuperLink")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take on a node (> 0)")
    p.add_argument("--node-wait", type=float, default=120.0, help="seconds to wait for the SuperNodes to connect (> 0)")
    p.add_argument("--run-timeout", type=float, default=7 * 24 * 3600.0, help="seconds the whole run may take (> 0)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per node worker (>= 0; 0: its default)")
    p.add_argument("--work-dir", default=None, help="keep Flower's files and logs here (default: a temporary folder)")
    p.add_argument("--node-config", default=None, help='more node settings for the SuperNodes started here, '
                   'e.g. "data-dir=\'/data\' idle-timeout=600" (not with --superlink)')
    return p


def fit_arguments(argv: list[str]):
    """fit's arguments with config files and the run folder made absolute (the ServerApp runs elsewhere),
    and the parsed config."""
    from fdlit.configuration.schema import parse_fit, rewrite_config_args

    argv = rewrite_config_args(argv)
    argv = [str(Path(a).resolve()) if i > 0 and argv[i - 1] == "--config" else a for i, a in enumerate(argv)]
    parser, cfg = parse_fit(argv)
    run_dir = str(Path(cfg.logger.run_dir).resolve())
    return [*argv, f"--logger.run_dir={run_dir}"], parser, cfg


def main(run_dir: str | None, argv: list[str]) -> int:
    """``deploy``: ``run_dir`` is ``--resume``'s run directory (taken out of the arguments), or None."""
    from fdlit.configuration.schema import attach_signed_numbers
    from fdlit.deployment import import_flwr
    from fdlit.deployment.checks import check_node_count, check_options

    options, rest = deploy_parser().parse_known_args(attach_signed_numbers(argv))  # `--timeout -inf`: a value
    check_options(options, None)  # the deploy options alone: refused before the run's imports
    from fdlit.runs.experiment import Experiment, resume_experiment

    if run_dir is not None:  # continue a deployed (or fit) run from its checkpoint, on the nodes
        run_dir = str(Path(run_dir).resolve())
        experiment = resume_experiment(run_dir, rest)  # checks the run directory, its checkpoint and the flags
        fit_args = ["--resume", run_dir, *rest]
    else:
        fit_args, parser, cfg = fit_arguments(rest)
        experiment = Experiment(cfg, parser)  # the whole config checked before any process starts
    check_secure_deployment(experiment.loop)
    check_clock_deployable(experiment.loop)
    import_flwr()
    # the client count as fit reads it from the config (no data is built)
    check_node_count(options, getattr(experiment.loop.data, "num_clients", None))
    runs_parent = None if run_dir is not None else experiment.config["logger"]["run_dir"]
    if options.superlink is None:  # the local nodes keep their clients' checkpoints beside the runs, across deployments
        runs = Path(run_dir).parent if run_dir is not None else Path(runs_parent).resolve()
        options.node_settings = {"checkpoint-dir": str(runs / NODE_CHECKPOINTS), **options.node_settings}
    # `kill`, Ctrl-C and a closed terminal stop the deployment, never half of it
    with deployment_locks(options, runs_parent), stop_signals():
        return run(options, fit_args)


def check_secure_deployment(loop) -> None:
    """Under secure aggregation the ServerApp holds no upload (the nodes mask them): colluding attackers,
    whose uploads the server copies, are refused rather than silently not copied."""
    adversaries = loop.adversaries
    if getattr(loop.privacy, "secure", False) and getattr(adversaries, "collude", False) and \
            getattr(adversaries, "attack", None) is not None:
        raise ConfigError("adversaries.collude", "colluding attackers send the first attacker's upload, which the "
                          "server copies; under secure aggregation a deployment's server holds no upload to copy; "
                          "set adversaries.collude: false, or use fit")


def check_clock_deployable(loop) -> None:
    """A deployment's time is real: an ``AsynchronousClock`` of federated distillation runs on it (its
    releases take the uploads that have arrived, fdlit.deployment.realtime); what needs the virtual
    clock's own time (a synchronous deadline, a release period) or updates a model asynchronously is
    refused here rather than silently run otherwise."""
    clock = getattr(loop, "clock", None)
    if clock is None:
        return
    if not getattr(clock, "asynchronous", False):
        raise ConfigError("federation.clock", "SynchronousClock runs under fit only (a virtual clock: its deadline "
                          "is virtual time); allowed with deploy: AsynchronousClock with a buffer (federated "
                          "distillation on real time), or null")
    if not clock.predictions:
        raise ConfigError("federation.clock", "asynchronous parameter exchange (FedBuff, FedAsync) runs under fit "
                          "only; allowed with deploy: AsynchronousClock with a rule that exchanges predictions, or null")
    if clock.period is not None:
        raise ConfigError("federation.clock.period", "a release period is virtual time and runs under fit only; "
                          "allowed with deploy: buffer (releases take the uploads as they arrive)")


class DeploymentInUse(ConfigError):
    """Another deploy holds the work folder or the run folder's parent."""

    def __init__(self, folder: Path, holder: str, option: str = "deploy --work-dir"):
        super().__init__(option, f"{folder} is in use by the deployment of {holder}; give each deployment its own "
                         "folder (a deploy without --work-dir gets a temporary one)")


@contextlib.contextmanager
def deployment_locks(options, runs_parent: str | None):
    """One deployment per ``--work-dir`` (its result and progress files, Flower's state) and per
    ``logger.run_dir`` started here (the run folder it reports as its own): a second is refused in one line,
    as a second process on a run folder is (``flock``: released when the holder ends in any way)."""
    from fdlit.runs.directory import RunLock

    locks = []
    try:
        if options.work_dir is not None:
            Path(options.work_dir).mkdir(parents=True, exist_ok=True)
            locks.append(RunLock(Path(options.work_dir), "deploy.lock", DeploymentInUse).acquire())
        if runs_parent is not None and options.superlink is None:
            Path(runs_parent).mkdir(parents=True, exist_ok=True)
            locks.append(RunLock(Path(runs_parent), "deploy.lock", lambda folder, holder: DeploymentInUse(
                folder, holder, "logger.run_dir")).acquire())
        yield
    finally:
        for lock in locks:
            lock.release()


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) reached ``deploy``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_stopping = [False]  # once clean-up began, further signals do not interrupt it


def on_stop_signal(signum, frame):
    if not _stopping[0]:
        _stopping[0] = True
        raise Stopped(signum)


@contextlib.contextmanager
def stop_signals():
    previous = {s: signal.signal(s, on_stop_signal) for s in STOP_SIGNALS}
    _stopping[0] = False
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run(options, fit_args: list[str]) -> int:
    """Start (or reach) the deployment, run, print the summary; every local process stopped at the end
    (done, failed, the SuperLink lost, or a stop signal)."""
    from fdlit.deployment.launcher import LocalDeployment, flower_env, work_folder
    from fdlit.deployment.watch import DeploymentWatch, NodeNeverJoined, SuperLinkLost
    from fdlit.federation import format_summary
    from fdlit.runs.directory import read_summary

    place = RunPlace(fit_args)
    try:
        with work_folder(options.work_dir) as work:
            env = flower_env(work)
            deployment: LocalDeployment | None = None
            try:
                if options.superlink is None:
                    deployment = LocalDeployment(options.nodes, work,
                                                 node_settings=getattr(options, "node_settings", None) or {})
                    deployment.start()
                address = options.superlink or deployment.address
                outcome = run_on(address, work, env, options, fit_args, DeploymentWatch(address, deployment))
            finally:
                _stopping[0] = True  # a signal now would leave processes behind: clean-up first
                if deployment is not None:
                    deployment.stop()
    except Stopped as stop:
        print(f"fdlit deploy: stopped by {signal.Signals(stop.signum).name}; every process started here was "
              f"stopped; {place.kept(options.superlink)}", file=sys.stderr)
        return 128 + stop.signum
    except NodeNeverJoined as gone:
        print(f"fdlit deploy: {gone}; every process started here was stopped", file=sys.stderr)
        return 2 if gone.refused else 1
    except SuperLinkLost as lost:
        print(f"fdlit deploy: the SuperLink is gone ({lost}); every process started here was stopped; "
              f"{place.kept(options.superlink)}", file=sys.stderr)
        return 1
    except (RuntimeError, TimeoutError) as exc:  # a process that would not start, flwr run refused, --run-timeout
        print(f"fdlit deploy: {' '.join(str(exc).split())}; every process started here was stopped", file=sys.stderr)
        return 1
    if outcome["status"] != "done":
        where = f"; run directory {outcome['run_dir']}" if outcome.get("run_dir") else ""
        if outcome.get("refused"):  # a node refused the run's config or its own data: bad input, exit status 2
            print(f"fdlit deploy: {outcome['error']}{where}; every process started here was stopped", file=sys.stderr)
            return 2
        print(f"fdlit deploy: the run failed: {outcome.get('error', 'unknown error')}{where}", file=sys.stderr)
        return 1
    if outcome.get("remote"):
        print("fdlit deploy: the run finished; its run directory is on the SuperLink's machine (logger.run_dir there)")
        return 0
    # summary.json writes NaN (e.g. FedAvg's teacher accuracy) as null
    summary = {k: math.nan if v is None else v for k, v in read_summary(Path(outcome["run_dir"])).items()}
    print(format_summary(summary))
    if outcome.get("wandb_sync"):
        print(f"fdlit: W&B run saved offline; upload it with: {outcome['wandb_sync']}")
    return 0


def wandb_dir() -> str:
    """Where a bare ``wandb sync`` run here looks for offline runs (``$WANDB_DIR``, else this
    directory): the ServerApp, which runs in Flower's work folder, links the run's offline folder there
    as ``fit`` does (on this machine only: a remote SuperLink's ServerApp links on its own machine)."""
    return os.environ.get("WANDB_DIR") or str(Path.cwd())


class RunPlace:
    """Where this deploy's run directory is: the resumed one, or the folder that appears under
    ``logger.run_dir`` once the ServerApp created it. For the one line that says what was kept."""

    def __init__(self, fit_args: list[str]):
        self.known: Path | None = None
        self.parent: Path | None = None
        self.before: set[Path] = set()
        if fit_args[:1] == ["--resume"]:
            path = Path(fit_args[1])
            self.known = path.parent if path.is_file() else path
            return
        given = [a.split("=", 1)[1] for a in fit_args if a.startswith("--logger.run_dir=")]
        if given:
            self.parent = Path(given[-1])
            self.before = set(self.parent.iterdir()) if self.parent.is_dir() else set()

    def find(self) -> Path | None:
        if self.known is not None or self.parent is None or not self.parent.is_dir():
            return self.known
        new = [d for d in self.parent.iterdir() if d not in self.before and (d / "config.yaml").exists()]
        return max(new, key=lambda d: d.stat().st_mtime) if new else None

    def kept(self, superlink: str | None) -> str:
        run_dir = self.find()
        if run_dir is None:
            if superlink is not None:
                return ("the run directory, if the run had begun, is on the SuperLink's machine (logger.run_dir there); "
                        "`python -m fdlit deploy --resume RUN_DIR` continues it from its last checkpoint")
            return "no run directory was created, nothing to continue"
        if (run_dir / "checkpoint.pt").exists():
            return (f"kept: {run_dir} with its last checkpoint; `python -m fdlit deploy --resume {run_dir}` "
                    f"continues it")
        from fdlit.runs.checkpoint import completed_rounds

        done = completed_rounds(run_dir)  # rounds may have completed before the first checkpoint was due
        if done:
            rounds = "round 1" if done == 1 else f"rounds 1 to {done}"
            return (f"kept: {run_dir}: {rounds} completed (metrics.jsonl holds them) but no checkpoint was written, "
                    "so there is nothing to continue from: run the config again to start anew")
        return f"kept: {run_dir}, without a checkpoint (no round completed): run the config again to start anew"


class RoundLines:
    """The ServerApp's per-round lines (``fit``'s), shown here as they are appended to its progress file."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def show(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(1 << 16)
        except OSError:
            return
        done = chunk.rfind(b"\n") + 1  # whole lines only
        if done:
            sys.stderr.write(chunk[:done].decode("utf-8", "replace"))
            sys.stderr.flush()
            self.offset += done


def run_on(address: str, work: Path, env: dict, options, fit_args: list[str], watch=None) -> dict:
    """Submit one fit run to the SuperLink at ``address`` and wait for its outcome (the ServerApp's
    result: status, run directory, error). ``watch``: a DeploymentWatch (node lines, a lost SuperLink)."""
    from fdlit.deployment.launcher import serverapp_file, stop_run, submit, wait_for_result, write_app, write_connection

    write_connection(env, address, options.root_certificates)
    result_file, progress_file = work / "result.json", work / "progress.log"
    for stale in (result_file, progress_file, serverapp_file(result_file)):
        stale.unlink(missing_ok=True)
    app = write_app(work / "app", {"fit-args": json.dumps(fit_args), "nodes": options.nodes,
                                   "timeout": float(options.timeout), "node-wait": float(options.node_wait),
                                   "threads": options.threads, "result-file": str(result_file),
                                   "progress-file": str(progress_file), "wandb-dir": wandb_dir()})
    run_id = submit(app, env)
    print(f"fdlit deploy: Flower run {run_id} on {address} with {options.nodes} SuperNodes", file=sys.stderr)
    lines = RoundLines(progress_file)

    def check() -> None:
        lines.show()
        if watch is not None:
            watch.check()

    try:
        outcome = wait_for_result(result_file, run_id, env, options.run_timeout, check)
        lines.show()
        return outcome
    except (KeyboardInterrupt, TimeoutError):
        _stopping[0] = True
        if watch is None or watch.deployment is None:  # a SuperLink that outlives this process: end the run
            stop_run(run_id, env)  # (a local one is stopped with everything else)
        raise
