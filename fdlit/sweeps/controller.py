"""Run a W&B sweep file locally: grid or random combinations, grouped, resumable, no W&B server needed.

``python -m fdlit sweep sweeps/tau.yaml [--dry_run] [-- extra fit flags]`` reads the same YAML that
``wandb sweep`` takes and builds each run's ``fit`` arguments exactly as ``wandb agent`` does: the
tokens after ``fit`` in ``command``, with ``${args}`` replaced by ``--<param>=<value>`` (the agent's
format: ``str(value)``). Extra flags after ``--`` go before the swept values, so the sweep wins.

Runs are grouped: every seed of one setting shares ``logger.group``; ``logger.name`` is the group
plus the seed, made safe for a folder name (a hub id's ``/`` becomes ``_``). Each combination's run
directory is found again by its resolved config: a *finished* run is skipped, an unfinished one is
resumed in its own folder (from its checkpoint, or from round 1 if none completed), so a sweep that
was stopped continues where it stopped when it is run again, and no combination gets two folders.

``method: random`` draws ``run_cap`` combinations (required) from the parameters' ``values`` and
distributions (W&B's ``uniform``, ``int_uniform``, ``log_uniform_values``, ``q_uniform``), from a
random stream seeded by the sweep's name, so running the sweep again draws the same combinations
and resumes them. ``method: bayes`` needs W&B's sweep server and is refused locally (no local engine
is installed), never run as a grid. ``--jobs N`` runs N combinations at once, each in its own process
and run directory, with torch's threads split between them (:mod:`fdlit.sweeps.workers`). ``--stack``
runs the combinations that share dataset, network and schedule as one process whose executor steps
all their clients together (:mod:`fdlit.sweeps.stack`).

A sweep's runs go to ``<logger.run_dir>/<sweep name>/`` (``runs/<sweep name>/`` by default), so a
sweep never mixes its runs with other runs; ``--logger.run_dir`` on the command line (the sweep
file's ``command``, its parameters, or the flags after ``--``) names the folder itself. A sweep's
bookkeeping sits in that folder's ``.sweep/``, never among its run folders: a run that fails for any
reason is recorded in ``.sweep/sweep-<name>.json`` with its error, and the sweep goes on. A sweep
started before sweeps had a folder of their own (its runs directly in ``<logger.run_dir>``, its
``sweep-<name>.json`` beside them) continues there, and says so in one line.

A sweep holds ``.sweep/sweep-<name>.lock`` (``flock``) while it runs: the same sweep started
again on the folder is refused in one line, so no combination runs twice, and only the holder
writes the results file (atomically, merged with the records already in it).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fdlit.errors import ConfigError
from fdlit.runs import strict_json
from fdlit.runs.atomic_write import enclosing_run_directory, write_file
from fdlit.runs.directory import (
    CHECKPOINT,
    CONFIG,
    RunFileError,
    RunLock,
    read_config,
    read_run_file,
    read_summary,
    safe_name,
)
from fdlit.runs.naming import short
from fdlit.sweeps.file import (  # noqa: F401  (the sweep file's names, importable from here)
    ARGS_MACRO,
    DISTRIBUTIONS,
    LOCAL_METHODS,
    METHODS,
    agent_flags,
    combinations,
    expand_grid,
    load_sweep,
    sample_random,
)
from fdlit.sweeps.folder import SweepInUse, adopt_old_bookkeeping, place_runs, results_path  # noqa: F401 (importable from here)
from fdlit.sweeps.workers import _threads, run_in_processes, sigterm_as_interrupt  # noqa: F401  (_threads: importable from here)


@dataclass
class SweepRun:
    values: dict[str, Any]  # swept dotted flag -> value
    name: str
    group: str
    argv: list[str]  # fit arguments (without the word ``fit``)
    config: dict | None = None  # resolved config, filled by ``resolve``
    existing: Path | None = None  # finished run directory with the same config
    partial: Path | None = None  # unfinished run directory with the same config: resumed


def _short(key: str, value: Any) -> str:
    return short(key, value)


def plan(spec: dict[str, Any], extra: list[str] = ()) -> list[SweepRun]:
    runs = []
    tail = spec["_fit_tail"]
    at = tail.index(ARGS_MACRO)
    for values in combinations(spec):
        setting = [_short(k, v) for k, v in values.items() if k != "seed"]
        group = safe_name("-".join([spec["name"], *setting]))
        name = safe_name(group + (f"-seed{values['seed']}" if "seed" in values else ""))
        argv = [*tail[:at], f"--logger.group={group}", f"--logger.name={name}", *extra,
                *agent_flags(values), *tail[at + 1:]]
        runs.append(SweepRun(values, name, group, argv))
    return runs


def resolve(runs: list[SweepRun], parser_factory: Callable) -> None:
    """Parse and check every combination before anything runs: a bad flag or value stops the whole
    sweep, naming the field and the combination."""
    from fdlit.configuration.code_allowlist import check_config_files
    from fdlit.configuration.schema import config_files, parse_error, rewrite_config_args
    from fdlit.runs.experiment import Experiment

    parser = parser_factory()
    parser.exit_on_error = False  # raise instead of exiting so the combination can be named
    for run in runs:
        argv = rewrite_config_args(run.argv)
        check_config_files(config_files(argv))  # bounded reads; every section a mapping
        try:
            cfg = parser.parse_args(argv)
        except argparse.ArgumentError as exc:  # in fit's words: a config file's typo with its file, line and the key meant
            located = parse_error(exc, parser, "fit", config_files(argv))
            raise ConfigError("parameters", f"combination {run.values} is not a valid fit config: {located}") from None
        except (ValueError, TypeError) as exc:
            raise ConfigError("parameters", f"combination {run.values} is not a valid fit config: {exc}") from None
        try:  # constructors check value ranges (k in [1, C], tau >= 0, seed, ...): cheap, nothing is trained
            experiment = Experiment(cfg, parser)
        except ConfigError as exc:
            raise ConfigError(exc.field, f"{str(exc).split(': ', 1)[-1]} (sweep combination {run.values})") from None
        # the checked experiment is kept for a stack to run (built once); its dump is the resolved config
        run.config = {"cfg": cfg, "parser": parser, "experiment": experiment,
                      "resolved": yaml.safe_load(experiment.config_yaml)}


def same_run(saved: dict, resolved: dict) -> bool:
    """Whether a saved config is this combination's: the same checkpoint fingerprint (so a run saved
    by an older fdlit, before a section or knob with a no-op default existed, is still found), the
    same number of rounds, and the same logger settings that name the run (not mode, progress or
    W&B start-up, so logging differently reuses it). A run saved with the methods' former names is
    compared in current names."""
    from fdlit.configuration.former_names import translated
    from fdlit.runs.checkpoint import config_fingerprint

    def key(config: dict) -> tuple:
        logger = config.get("logger") or {}
        return (config_fingerprint(config), (config.get("federation") or {}).get("rounds"),
                {k: logger.get(k) for k in ("name", "group", "run_dir")})

    return isinstance(saved, dict) and key(translated(saved)[0]) == key(resolved)


def existing_runs(run_dir: Path, damaged: list[tuple[Path, str]] | None = None) -> list[tuple[Path, dict, bool]]:
    """(run directory, saved config, finished) of every run directory directly under ``run_dir``;
    ``damaged`` gets (run directory, what) for each whose config or summary fdlit could not read (a
    config: the folder is left alone; a summary: the run counts as unfinished, so it is resumed)."""
    out = []
    for path in sorted(p for p in Path(run_dir).glob("*") if p.is_dir() and (p / CONFIG).exists()):
        try:
            config = read_config(path)
        except (OSError, yaml.YAMLError, RunFileError) as exc:
            if damaged is not None:
                damaged.append((path, exc.reason if isinstance(exc, RunFileError) else f"{CONFIG} unreadable"))
            continue
        try:
            summary = read_summary(path)
            finished = isinstance(summary, dict) and bool(summary.get("finished"))
        except OSError:
            finished = False  # killed before its first round ended
        except ValueError as exc:  # a summary that is not JSON, or that fdlit refuses to read
            finished = False
            if damaged is not None:
                damaged.append((path, exc.reason if isinstance(exc, RunFileError) else "summary.json is not JSON"))
        out.append((path, config, finished))
    return out


def _furthest(paths: list[Path]) -> Path | None:
    """Of several unfinished directories of one combination, the one with a checkpoint, newest."""
    return max(paths, key=lambda p: ((p / CHECKPOINT).exists(), p.name), default=None)


def lookup(config: dict, dotted: str) -> Any:
    """Value of a dotted fit flag in a saved config; ``aggregator.tau`` lives at
    ``aggregator.init_args.tau`` and ``aggregator`` means its class_path (jsonargparse subclasses)."""
    node: Any = config
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and isinstance(node.get("init_args"), dict) and part in node["init_args"]:
            node = node["init_args"][part]
        else:
            raise KeyError(dotted)
    # ``--aggregator=<class path>`` sets the class: compare against class_path, not the whole dict
    return node["class_path"] if isinstance(node, dict) and "class_path" in node else node


def _plain(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}


def _record(path: Path, spec: dict[str, Any], records: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, strict_json.dumps({"sweep": spec["name"], "method": spec.get("method", "grid"),
                                        "runs": list(records.values())}, indent=1), field="sweep")  # never half a file


def _recorded(path: Path) -> dict[str, dict]:
    """The records an earlier run of the sweep left in its results file (none if it is unreadable),
    so that running it again keeps every record it does not replace."""
    try:
        runs = json.loads(read_run_file(path)).get("runs", [])
        return {r["name"]: r for r in runs if isinstance(r, dict) and isinstance(r.get("name"), str)}
    except (OSError, ValueError, AttributeError):  # RunFileError is a ValueError
        return {}


def run_sweep(path: str | Path, extra: list[str] = (), dry_run: bool = False,
              out: Callable[[str], None] = print, jobs: int = 1, stack: bool = False) -> dict[str, Any]:
    """Run (or list) every combination; returns counts, the failed runs and the run directories.
    Every outcome is also written to the sweep's results file (``results`` in the returned dict)."""
    from fdlit.configuration.schema import fit_parser

    if not isinstance(jobs, int) or jobs < 1:
        raise ConfigError("jobs", f"must be a positive integer; got {jobs!r}")
    spec = load_sweep(path)
    runs = plan(spec, list(extra))
    note = place_runs(runs, spec["name"], fit_parser)
    resolve(runs, fit_parser)
    folder = Path(runs[0].config["resolved"]["logger"]["run_dir"])
    results = results_path(folder, spec["name"])
    enclosing = enclosing_run_directory(folder)
    if enclosing is not None:  # its runs and results would land in another run's folder
        raise ConfigError("logger.run_dir", f"{str(folder)!r} is inside the run directory {str(enclosing)!r}, "
                          "whose files only its run writes; choose another folder for the sweep's runs")
    if note:
        out(note)
    lock = None
    if not dry_run:  # one process per sweep and folder: it alone decides what is left to run
        results.parent.mkdir(parents=True, exist_ok=True)
        lock = RunLock(results.parent, results.with_suffix(".lock").name,
                       lambda _, holder: SweepInUse(folder, holder)).acquire()
    try:
        if lock is not None:
            adopt_old_bookkeeping(folder, results)
        with sigterm_as_interrupt():  # `kill` stops a sweep as Ctrl-C does
            return _run_sweep(spec, runs, results, dry_run, out, jobs, stack)
    finally:
        if lock is not None:
            lock.release()


def _run_sweep(spec: dict[str, Any], runs: list[SweepRun], results: Path, dry_run: bool,
               out: Callable[[str], None], jobs: int, stack: bool = False) -> dict[str, Any]:
    from fdlit.federation import format_summary
    from fdlit.runs.experiment import Experiment

    by_dir: dict[str, list[tuple[Path, dict, bool]]] = {}
    damaged: list[tuple[Path, str]] = []
    for run in runs:
        run_dir = run.config["resolved"]["logger"]["run_dir"]
        if run_dir not in by_dir:
            by_dir[run_dir] = existing_runs(Path(run_dir), damaged)
        mine = [(p, finished) for p, c, finished in by_dir[run_dir] if same_run(c, run.config["resolved"])]
        run.existing = next((p for p, finished in mine if finished), None)
        run.partial = None if run.existing else _furthest([p for p, _ in mine])
    todo = [r for r in runs if r.existing is None]
    for run in runs:  # the checked experiments are kept for a stack in this process only
        if run.existing is not None or not stack or jobs > 1:
            run.config.pop("experiment", None)
    resumed = sum(r.partial is not None for r in todo)
    method = spec.get("method", "grid")
    drawn = f" ({method}: {len(runs)} drawn of run_cap {spec['run_cap']})" if method == "random" else ""
    out(f"fdlit sweep {spec['name']}: {len(runs)} combinations{drawn}, {len(runs) - len(todo)} finished, "
        f"{len(todo)} to run" + (f" ({resumed} resumed in their own folder)" if resumed else "")
        + (f", {jobs} at a time" if jobs > 1 and todo else ""))
    if damaged:
        out(f"fdlit sweep: {len(damaged)} run folder(s) with a file fdlit could not read (a config: left alone; a "
            "summary: counted unfinished, resumed from its checkpoint): "
            + "; ".join(f"{p.name} ({why})" for p, why in damaged))
    if dry_run:
        for i, run in enumerate(runs, 1):
            state = (f"done ({run.existing})" if run.existing else f"resume ({run.partial})" if run.partial
                     else "todo")
            out(f"  [{i}/{len(runs)}] {state:>5}  group={run.group}  fdlit fit {' '.join(run.argv)}")
        return {"total": len(runs), "skipped": len(runs) - len(todo), "ran": 0, "failed": [], "run_dirs": []}
    records = _recorded(results)
    records |= {r.name: {"name": r.name, "group": r.group, "values": r.values, "status": "finished",
                        "run_dir": str(r.existing)} for r in runs if r.existing}
    failed, run_dirs = [], []

    def done(run: SweepRun, outcome: dict[str, Any]) -> None:
        if outcome["status"] != "finished" and run.partial and "CheckpointError" in str(outcome.get("error")):
            # the sweep would resume this folder again: say what starts the combination anew instead
            outcome = {**outcome, "error": f"{outcome['error']} (the sweep resumes {run.partial} every time it "
                       f"runs: move that folder out of {run.partial.parent} and run the sweep again to start "
                       "this combination anew)"}
        records[run.name] = {"name": run.name, "group": run.group, "values": run.values, **outcome}
        _record(results, spec, records)
        if outcome["status"] == "finished":
            run_dirs.append(Path(outcome["run_dir"]))
            out(f"fdlit sweep: {run.name} finished\n" + format_summary(outcome["summary"]))
        else:  # one failed combination does not stop the others
            print(f"fdlit sweep: {run.name} failed: {outcome['error']} (recorded in {results})", file=sys.stderr)
            failed.append(run.name)

    stacks, alone = [], todo
    if stack and todo:
        from fdlit.sweeps.stack import plan_stacks, run_stack

        stacks, alone = plan_stacks(todo, jobs)
        out(f"fdlit sweep: {sum(map(len, stacks))} runs stacked in {len(stacks)} process(es)"
            + (f"; run one by one (another dataset, network, schedule or executor, or alone in its setting): "
               f"{', '.join(r.name for r in alone)}" if alone else ""))
    if jobs == 1:
        for members in stacks:
            run_stack(members, done, out)
        for i, run in enumerate(alone, 1):
            out(f"fdlit sweep: [{i}/{len(alone)}] {run.name}" + (f" (resuming {run.partial})" if run.partial else ""))
            run.config.pop("experiment", None)  # a run alone is built when its turn comes, after the runs before it
            experiment = None
            try:
                experiment = Experiment(run.config["cfg"], run.config["parser"], resume_from=run.partial)
                summary = experiment.fit()
                done(run, {"status": "finished", "run_dir": str(experiment.run_path), "summary": _plain(summary)})
            except Exception as exc:  # Ctrl-C still stops the sweep; any other error is this run's
                run_dir = str(experiment.run_path) if experiment is not None and experiment.run_path else None
                done(run, {"status": "failed", "run_dir": run_dir, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=8)})
    else:
        run_in_processes(stacks, alone, jobs, done, out)
    return {"total": len(runs), "skipped": len(runs) - len(todo), "ran": len(todo) - len(failed),
            "failed": failed, "run_dirs": run_dirs, "results": results}
