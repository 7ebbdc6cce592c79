"""``fdlit sweep FILE --stack``: a sweep's runs stacked into one process.

The combinations that share the dataset, the network, the clients' optimisation (but the learning
rate), the phase schedule and the device run as one stack: each is its own run (its own partition and
seeds, server, metrics, run directory, summary, checkpoints, W&B run), run in its own thread through
:mod:`fdlit.execution.rendezvous`, whose executor trains and evaluates every run's clients together
where their steps compute alike. The others run one by one, as without ``--stack``, and are named.
A run that fails fails alone; the others go on. With ``--jobs N`` a stack is split into N stacks,
each in its own process.

``stack_runs`` is the same for Python use: :class:`~fdlit.runs.experiment.Experiment` objects in,
their summaries (or errors) out.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fdlit.callbacks import FederationCallback, RoundView

# what a stack shares (sections of the resolved config); the client section but its learning rates
SHARED_SECTIONS = ("data", "model", "server")
SCHEDULE = ("private_epochs_first", "private_epochs", "public_epochs_first", "public_epochs", "accelerator",
            "precision", "devices", "mode", "compile_backend", "channels_last",
            "cuda_graphs")
STACKABLE_EXECUTORS = ("fdlit.execution.SequentialExecutor", "fdlit.execution.executor.SequentialExecutor",
                       "fdlit.execution.VectorizedExecutor", "fdlit.execution.vectorized.VectorizedExecutor")


def stack_key(resolved: dict[str, Any]) -> str | None:
    """The key of runs that stack together (equal keys: one stack); None for a run that cannot stack
    (an executor whose clients live in other processes)."""
    federation = resolved.get("federation") or {}
    executor = federation.get("executor")
    if executor is not None and (not isinstance(executor, dict) or executor.get("class_path") not in STACKABLE_EXECUTORS):
        return None
    client = {k: v for k, v in (resolved.get("client") or {}).items() if k not in ("lr", "public_lr")}
    shared = {name: resolved.get(name) for name in SHARED_SECTIONS}
    return json.dumps([shared, client, {k: federation.get(k) for k in SCHEDULE}, executor], sort_keys=True,
                      default=str)


def plan_stacks(runs: Sequence[Any], jobs: int = 1) -> tuple[list[list[Any]], list[Any]]:
    """(stacks, runs that run alone): runs (``SweepRun``) with the same :func:`stack_key`, in the
    sweep's order; a stack is split into ``jobs`` stacks of about equal size (one per process)."""
    by_key: dict[str, list[Any]] = {}
    alone = []
    for run in runs:
        key = stack_key(run.config["resolved"])
        if key is None:
            alone.append(run)
        else:
            by_key.setdefault(key, []).append(run)
    stacks = []
    for members in by_key.values():
        if len(members) == 1:
            alone.extend(members)
            continue
        parts = max(1, min(jobs, len(members) // 2))  # every stack at least two runs
        stacks.extend(members[i::parts] for i in range(parts))  # round robin: seeds and settings spread
    alone.sort(key=lambda r: runs.index(r))
    return stacks, alone


class RoundLine(FederationCallback):
    """One line per run and round (a progress bar per stacked run would overwrite the others')."""

    def __init__(self, name: str, out: Callable[[str], None]):
        self.name, self.out = name, out

    def on_round_end(self, view: RoundView, round, metrics):
        acc = metrics.get("global_acc_mean")
        shown = f", global acc {acc:.4f}" if isinstance(acc, float) else ""
        self.out(f"fdlit sweep: {self.name} round {round}/{view.rounds}{shown}")


@contextlib.contextmanager
def several_wandb_runs() -> Iterator[None]:
    """Each stacked run opens its own W&B run in this process (``reinit="create_new"``), none ends another's."""
    from fdlit.runs import wandb_logger

    before, wandb_logger.REINIT = wandb_logger.REINIT, "create_new"
    try:
        yield
    finally:
        wandb_logger.REINIT = before


def _plain(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}


def _failed(experiment: Any, exc: BaseException) -> dict[str, Any]:
    run_dir = str(experiment.run_path) if experiment is not None and experiment.run_path else None
    return {"status": "failed", "run_dir": run_dir, "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc, limit=8))}


def stack_runs(experiments: Sequence[Any], names: Sequence[str], out: Callable[[str], None] = print,
               done: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Fit ``experiments`` (:class:`~fdlit.runs.experiment.Experiment`, not yet fitted) stacked in
    this process; returns each one's outcome: ``{"status": "finished", "run_dir", "summary"}`` or
    ``{"status": "failed", "run_dir", "error", "traceback"}``. ``done(i, outcome)`` is called as
    each run ends (in its turn: nothing else runs meanwhile)."""
    from fdlit.execution.rendezvous import Rendezvous, fit_stacked

    outcomes: list[dict[str, Any] | None] = [None] * len(experiments)

    def body(i: int, experiment: Any) -> Callable[[], dict[str, Any]]:
        def fit() -> dict[str, Any]:
            try:
                summary = experiment.fit()
                outcome = {"status": "finished", "run_dir": str(experiment.run_path), "summary": _plain(summary)}
            except Exception as exc:  # this run's; the others go on
                outcome = _failed(experiment, exc)
            outcomes[i] = outcome
            if done is not None:
                done(i, outcome)
            return outcome
        return fit

    for experiment, name in zip(experiments, names, strict=True):
        experiment.logger.progress = False
        experiment.loop.callbacks.append(RoundLine(name, out))
    rendezvous = Rendezvous()
    with several_wandb_runs():
        results = fit_stacked([e.loop for e in experiments], names,
                              [body(i, e) for i, e in enumerate(experiments)], rendezvous)
    out(f"fdlit sweep: a stack of {len(experiments)} runs ended: {rendezvous.merged_calls} client calls ran "
        f"stacked over several runs, {rendezvous.alone_calls} for one run; {rendezvous.twin_calls} runs' calls were "
        "bit for bit another run's and not computed again")
    for i, (experiment, (_, error)) in enumerate(zip(experiments, results, strict=True)):
        if outcomes[i] is None:  # stopped by something other than an Exception inside fit
            outcomes[i] = _failed(experiment, error or RuntimeError("the run did not end"))
    return outcomes


def run_stack(runs: Sequence[Any], done: Callable[[Any, dict[str, Any]], None], out: Callable[[str], None]) -> None:
    """A sweep's stack (``SweepRun`` objects, resolved) in this process; ``done(run, outcome)`` per run."""
    from fdlit.runs.experiment import Experiment

    ready, experiments = [], []
    for run in runs:
        try:
            # the experiment the sweep built to check the run, unless it resumes a saved one
            built = run.config.pop("experiment", None)
            experiments.append(built if built is not None and run.partial is None
                               else Experiment(run.config["cfg"], run.config["parser"], resume_from=run.partial))
            ready.append(run)
        except Exception as exc:  # refused before any work: this run alone
            done(run, _failed(None, exc))
    if experiments:
        stack_runs(experiments, [r.name for r in ready], out, done=lambda i, outcome: done(ready[i], outcome))


def run_stack_job(items: list[tuple[list[str], str | None, str]], threads: int | None) -> list[dict[str, Any]]:
    """One stack in a worker process (``--stack --jobs N``): (fit arguments, folder to resume or None,
    name) per run; returns every run's outcome, in order (a worker never raises)."""
    import torch

    from fdlit.configuration.schema import parse_fit, rewrite_config_args
    from fdlit.runs.experiment import Experiment

    if threads is not None:
        torch.set_num_threads(threads)
    outcomes: list[dict[str, Any] | None] = [None] * len(items)
    experiments, names, where = [], [], []
    for i, (argv, partial, name) in enumerate(items):
        try:
            parser, cfg = parse_fit(rewrite_config_args(argv))
            experiments.append(Experiment(cfg, parser, resume_from=Path(partial) if partial else None))
            names.append(name)
            where.append(i)
        except Exception as exc:
            outcomes[i] = _failed(None, exc)
    for i, outcome in zip(where, stack_runs(experiments, names, print) if experiments else [], strict=True):
        outcomes[i] = {**outcome, "torch_threads": torch.get_num_threads()}
    return outcomes
