"""A sweep's runs in worker processes (``fdlit sweep --jobs N``): a fresh interpreter per worker, torch's
threads split between them, each run (or stack of runs, ``--stack``) in its own run directory."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _threads(jobs: int) -> int:
    """torch threads per run when ``jobs`` runs share this machine's cores."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


_stopped = [False]  # in a worker: a SIGINT stopped it (a job queued to it after that does not start)


def _interrupt(signum, frame) -> None:
    _stopped[0] = True
    raise KeyboardInterrupt


def _unless_stopped(job: Callable[..., Any], *args: Any) -> Any:
    """``job(*args)``, unless this worker was stopped: the pool hands each worker a job ahead of time,
    which ``cancel_futures`` cannot take back, so a stopped sweep's worker would otherwise start it and
    run it to its end."""
    if _stopped[0]:
        return {"status": "failed", "run_dir": None, "error": "not started: the sweep was stopped"}
    return job(*args)


def _stop_with_the_sweep(sweep_pid: int) -> None:
    """Pool initializer: SIGINT stops the worker's run (a KeyboardInterrupt, whatever the sweep inherited);
    a worker is sent SIGTERM when the sweep process dies (Linux), so a killed sweep
    leaves no worker behind it that goes on through the queued combinations; the worker's run then
    stops as a terminated ``fit`` does, with its last checkpoint, and the next sweep resumes it."""
    # the sweep stops its workers with SIGINT; a sweep started with SIGINT ignored (in the background of a
    # non-interactive shell, under a test runner's worker) hands that on to its children: take it back
    signal.signal(signal.SIGINT, _interrupt)  # a KeyboardInterrupt, as Python's default handler raises
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != sweep_pid:  # the sweep died before the request above was in place
        os._exit(1)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (``kill``) stops a sweep as Ctrl-C does: a KeyboardInterrupt in this process (each
    unfinished run keeps its last checkpoint, the sweep prints how to continue), and SIGINT to its
    worker processes, which a terminal's Ctrl-C reaches by itself (their runs stop the same way)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        import multiprocessing

        for child in multiprocessing.active_children():  # the pool's workers (public API)
            with contextlib.suppress(OSError):
                os.kill(child.pid, signal.SIGINT)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_one(argv: list[str], partial: str | None, threads: int | None) -> dict[str, Any]:
    """One combination in a worker process: parse its flags as ``fit`` does, run it, and return its
    summary or the error (a worker never raises: the sweep records the failure and goes on)."""
    import torch

    from fdlit.configuration.schema import parse_fit, rewrite_config_args
    from fdlit.runs.experiment import Experiment

    if threads is not None:
        torch.set_num_threads(threads)  # N runs x all cores each would oversubscribe the machine
    experiment = None
    try:
        parser, cfg = parse_fit(rewrite_config_args(argv))
        experiment = Experiment(cfg, parser, resume_from=Path(partial) if partial else None)
        summary = experiment.fit()
        return {"status": "finished", "run_dir": str(experiment.run_path), "summary": _plain(summary),
                "torch_threads": torch.get_num_threads()}
    except Exception as exc:  # recorded by the sweep; Ctrl-C stops the worker as it stops a serial sweep
        run_dir = str(experiment.run_path) if experiment is not None and experiment.run_path else None
        return {"status": "failed", "run_dir": run_dir, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=8)}


def _plain(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}


def run_in_processes(stacks: list[list[Any]], alone: list[Any], jobs: int, done: Callable[[Any, dict[str, Any]], None],
                     out: Callable[[str], None]) -> None:
    """Run every stack and every single run (``SweepRun`` objects) in ``jobs`` worker processes;
    ``done(run, outcome)`` as each ends."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from fdlit.sweeps.stack import run_stack_job

    # spawn: a fresh interpreter per worker (no forked torch / W&B state); each worker has its own
    # run directory and lock, and torch threads are split between the jobs
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_stop_with_the_sweep, initargs=(os.getpid(),)) as pool:
        futures: dict[Any, Any] = {}
        for members in stacks:
            out(f"fdlit sweep: a stack of {len(members)} queued: {', '.join(r.name for r in members)}")
            items = [(r.argv, str(r.partial) if r.partial else None, r.name) for r in members]
            futures[pool.submit(_unless_stopped, run_stack_job, items, _threads(jobs))] = members
        for i, run in enumerate(alone, 1):
            out(f"fdlit sweep: [{i}/{len(alone)}] {run.name} queued" + (f" (resuming {run.partial})" if run.partial else ""))
            futures[pool.submit(_unless_stopped, _run_one, run.argv, str(run.partial) if run.partial else None,
                                _threads(jobs))] = run
        try:
            _collect(futures, done)
        except KeyboardInterrupt:  # queued runs never start; running ones stop (SIGINT) with their checkpoint
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _collect(futures: dict[Any, Any], done: Callable[[Any, dict[str, Any]], None]) -> None:
    """``done(run, outcome)`` for every run as its future ends."""
    from concurrent.futures import as_completed

    for future in as_completed(futures):
        members = futures[future]
        try:
            outcome = future.result()
        except Exception as exc:  # the worker process itself died (killed, out of memory)
            outcome = {"status": "failed", "run_dir": None, "error": f"{type(exc).__name__}: {exc}"}
        if isinstance(members, list):  # a stack: one outcome per run (or the worker's death, for each)
            for run, one in zip(members, outcome if isinstance(outcome, list) else [outcome] * len(members),
                                strict=True):
                done(run, one)
        else:
            done(members, outcome)
