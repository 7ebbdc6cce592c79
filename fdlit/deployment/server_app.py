"""The ServerApp: a ``fit`` run whose clients live on the SuperNodes.

It parses the same ``fit`` arguments as the command line, builds the same
:class:`~fdlit.runs.experiment.Experiment` (run directory, metrics, checkpoints, W&B, summary), and
replaces only the executor: a :class:`~fdlit.deployment.executor.FlowerExecutor` on this run's Grid.
The method's server part, the privacy accountant, the ledger and the evaluation stay here.

Run config (``flwr run --run-config``; :mod:`fdlit.deployment.launcher` sets it): ``fit-args`` (the
``fit`` arguments as a JSON list; ``["--resume", RUN_DIR, ...]`` continues a run), ``nodes``, ``timeout`` (seconds one request may take on a node),
``node-wait`` (seconds to wait for the nodes at start), ``threads`` (torch threads per node worker,
0: its default), ``result-file`` (where to write the run's outcome as JSON for the launcher),
``progress-file`` (where to append the per-round lines ``fit`` prints, for the launcher to show) and
``wandb-dir`` (where the deploy command's bare ``wandb sync`` looks: an offline run is linked there).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import traceback
import warnings
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()

RUN_CONFIG_DEFAULTS = {"fit-args": "[]", "nodes": 1, "timeout": 600.0, "node-wait": 120.0, "threads": 0,
                       "result-file": "", "progress-file": "", "wandb-dir": ""}


@app.main()
def main(grid: Grid, context: Context) -> None:
    from fdlit.configuration.schema import parse_fit
    from fdlit.deployment.executor import FlowerExecutor
    from fdlit.deployment.pace import short_object_pulls

    short_object_pulls()  # replies whose arrays are still arriving: asked for again soon, not after 1-10 s
    from fdlit.runs.experiment import Experiment, resume_experiment

    settings = {**RUN_CONFIG_DEFAULTS, **dict(context.run_config)}
    if settings["wandb-dir"] and Path(str(settings["wandb-dir"])).is_dir():  # the deploy command's W&B folder
        os.environ["WANDB_DIR"] = str(settings["wandb-dir"])
    outcome: dict = {"status": "failed"}
    experiment = None
    if settings["result-file"]:  # which process this is, for the launcher to watch (fdlit.deployment.launcher)
        from fdlit.deployment.launcher import serverapp_file

        with contextlib.suppress(OSError):  # the launcher's folder is not on this machine
            serverapp_file(Path(str(settings["result-file"]))).write_text(
                json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    try:
        args = json.loads(str(settings["fit-args"]))
        if args[:1] == ["--resume"]:  # a run directory of this machine, continued from its checkpoint
            experiment = resume_experiment(args[1], args[2:])
        else:
            parser, cfg = parse_fit(args)
            experiment = Experiment(cfg, parser)
        executor = FlowerExecutor(grid, nodes=int(settings["nodes"]), timeout_s=float(settings["timeout"]),
                                  node_wait_s=float(settings["node-wait"]), threads=int(settings["threads"]) or None)
        experiment.loop.settings.executor = executor
        if settings["progress-file"]:  # the round lines and warnings, for the deploy command to show as they come
            stream = experiment.progress_stream = open(str(settings["progress-file"]), "a", buffering=1)  # noqa: SIM115
            warnings.showwarning = lambda message, category, *_, **__: stream.write(
                f"fdlit: {category.__name__}: {message}\n")
        executor.states_every = experiment.checkpoint.every_n_rounds  # states come up with a checkpointed round's last reply
        executor.bind(experiment.loop, experiment.config_yaml)
        experiment.run()
        outcome = {"status": "done"}
    except BaseException as exc:
        from fdlit.deployment.messages import NodeRefused

        outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        if isinstance(exc, NodeRefused):  # bad input to a node: its one line, and deploy's exit status 2
            outcome.update(error=str(exc), refused=True)
        raise
    finally:
        if experiment is not None and experiment.run_path is not None:
            outcome["run_dir"] = str(experiment.run_path)
            wandb = experiment.wandb
            if wandb is not None and wandb.mode == "offline" and wandb.run is not None:
                outcome["wandb_sync"] = wandb.sync_command()  # the deploy command prints it, as fit does
        if settings["result-file"]:
            Path(str(settings["result-file"])).write_text(json.dumps(outcome))
