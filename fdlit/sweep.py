"""Run a W&B sweep file locally: every grid combination, grouped, resumable, no W&B server needed.

``python -m fdlit sweep sweeps/tau.yaml [--dry_run] [-- extra fit flags]`` reads the same YAML that
``wandb sweep`` takes and builds each run's ``fit`` arguments exactly as ``wandb agent`` does: the
tokens after ``fit`` in ``command``, with ``${args}`` replaced by ``--<param>=<value>`` (the agent's
format: ``str(value)``). Extra flags after ``--`` go before the swept values, so the sweep wins.

Runs are grouped: every seed of one setting shares ``logger.group``; ``logger.name`` is the group
plus the seed, made safe for a folder name (a hub id's ``/`` becomes ``_``). Each combination's run
directory is found again by its resolved config: a *finished* run is skipped, an unfinished one is
resumed in its own folder (from its checkpoint, or from round 1 if none completed), so a sweep that
was stopped continues where it stopped when it is run again, and no combination gets two folders.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from fdlit.errors import ConfigError
from fdlit.runs.directory import CHECKPOINT, CONFIG, read_config, read_summary, safe_name

METHODS = ("grid", "random", "bayes")
ARGS_MACRO = "${args}"


@dataclass
class SweepRun:
    values: dict[str, Any]  # swept dotted flag -> value
    name: str
    group: str
    argv: list[str]  # fit arguments (without the word ``fit``)
    config: Optional[dict] = None  # resolved config, filled by ``resolve``
    existing: Optional[Path] = None  # finished run directory with the same config
    partial: Optional[Path] = None  # unfinished run directory with the same config: resumed


def load_sweep(path: str | Path) -> dict[str, Any]:
    """Read and check a sweep file; errors name the offending key."""
    path = Path(path)
    if not path.exists():
        raise ConfigError("sweep", f"no sweep file {str(path)!r}")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError("sweep", f"{path} is not valid YAML ({exc})") from None
    if not isinstance(spec, dict):
        raise ConfigError("sweep", f"{path} must be a mapping with 'parameters' and 'command'")
    method = spec.get("method", "grid")
    if method not in METHODS:
        raise ConfigError("method", f"allowed: {', '.join(METHODS)}; got {method!r}")
    params = spec.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ConfigError("parameters", "a non-empty mapping of dotted fit flags is required")
    for key, p in params.items():
        if not isinstance(p, dict) or ("values" not in p and "value" not in p):
            raise ConfigError(f"parameters.{key}", "local sweeps need 'values: [...]' or 'value: x' "
                              "(distributions such as min/max only run under wandb agent)")
        if "values" in p and (not isinstance(p["values"], list) or not p["values"]):
            raise ConfigError(f"parameters.{key}.values", "must be a non-empty list")
    command = spec.get("command")
    if not isinstance(command, list) or "fit" not in command or ARGS_MACRO not in command:
        raise ConfigError("command", "must be a list that runs fdlit 'fit' and contains '${args}'")
    tail = [str(t) for t in command[command.index("fit") + 1:]]
    if "--config" not in tail or tail.index("--config") > tail.index(ARGS_MACRO):
        raise ConfigError("command", "'${args}' must come after '--config <file>' so sweep values override it")
    other = [t for t in tail if t.startswith("${") and t != ARGS_MACRO]
    if other:
        raise ConfigError("command", f"only '${{args}}' is supported after 'fit', found {other}")
    spec["_fit_tail"] = tail
    spec.setdefault("name", path.stem)
    return spec


def expand_grid(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination, in file order (first parameter varies slowest)."""
    keys = list(spec["parameters"])
    choices = [p["values"] if "values" in p else [p["value"]] for p in spec["parameters"].values()]
    return [dict(zip(keys, combo)) for combo in itertools.product(*choices)]


def agent_flags(values: dict[str, Any]) -> list[str]:
    """``${args}`` exactly as wandb agent expands it: ``--param=value`` with Python's str(value)."""
    return [f"--{k}={v}" for k, v in values.items()]


KEY_ALIASES = {"classes_per_client": "k", "dirichlet_alpha": "alpha", "num_clients": "M"}
CLASS_ALIASES = {"ProbabilityAveragingAggregator": "avg", "UncertaintyWeightedAggregator": "uwa",
                 "SmoothedUncertaintyWeightedAggregator": "suwa"}


def _short(key: str, value: Any) -> str:
    """Readable name parts: ``tau0.5``, ``k3``, ``avg`` (a class path is named by its class)."""
    if isinstance(value, str) and "." in value and "/" not in value and not value.replace(".", "").isdigit():
        cls = value.rsplit(".", 1)[-1]
        return safe_name(CLASS_ALIASES.get(cls, cls))
    last = key.rsplit(".", 1)[-1]
    return safe_name(f"{KEY_ALIASES.get(last, last)}{value}")  # "org/model" must not become a subfolder


def plan(spec: dict[str, Any], extra: list[str] = ()) -> list[SweepRun]:
    runs = []
    tail = spec["_fit_tail"]
    at = tail.index(ARGS_MACRO)
    for values in expand_grid(spec):
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
    from fdlit.config import rewrite_config_args
    from fdlit.runs.experiment import Experiment

    parser = parser_factory()
    parser.exit_on_error = False  # raise instead of exiting so the combination can be named
    for run in runs:
        try:
            cfg = parser.parse_args(rewrite_config_args(run.argv))
        except (argparse.ArgumentError, ValueError, TypeError) as exc:
            raise ConfigError("parameters", f"combination {run.values} is not a valid fit config: {exc}") from None
        try:  # constructors check value ranges (k in [1, C], tau >= 0, seed, ...): cheap, nothing is trained
            Experiment(cfg, parser)
        except ConfigError as exc:
            raise ConfigError(exc.field, f"{str(exc).split(': ', 1)[-1]} (sweep combination {run.values})") from None
        run.config = {"cfg": cfg, "parser": parser,
                      "resolved": yaml.safe_load(parser.dump(cfg, skip_unset=False))}


def same_run(saved: dict, resolved: dict) -> bool:
    """Whether a saved config is this combination's: equal in everything but the logger settings
    that do not name the run (mode, progress, W&B start-up), so logging differently reuses it."""
    def key(config: dict) -> dict:
        logger = config.get("logger") or {}
        return {**config, "logger": {k: logger.get(k) for k in ("name", "group", "run_dir")}}

    return isinstance(saved, dict) and key(saved) == key(resolved)


def existing_runs(run_dir: Path) -> list[tuple[Path, dict, bool]]:
    """(run directory, saved config, finished) of every run directory directly under ``run_dir``."""
    out = []
    for path in sorted(p for p in Path(run_dir).glob("*") if p.is_dir() and (p / CONFIG).exists()):
        try:
            config = read_config(path)
        except (OSError, yaml.YAMLError):
            continue
        try:
            finished = bool(read_summary(path).get("finished"))
        except (OSError, json.JSONDecodeError):
            finished = False  # killed before its first round ended
        out.append((path, config, finished))
    return out


def _furthest(paths: list[Path]) -> Optional[Path]:
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


def run_sweep(path: str | Path, extra: list[str] = (), dry_run: bool = False,
              out: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or list) every combination; returns counts and the run directories."""
    from fdlit.config import fit_parser
    from fdlit.federation import NumericalFault, format_summary
    from fdlit.runs.experiment import Experiment

    spec = load_sweep(path)
    runs = plan(spec, list(extra))
    resolve(runs, fit_parser)
    by_dir: dict[str, list[tuple[Path, dict, bool]]] = {}
    for run in runs:
        run_dir = run.config["resolved"]["logger"]["run_dir"]
        if run_dir not in by_dir:
            by_dir[run_dir] = existing_runs(Path(run_dir))
        mine = [(p, finished) for p, c, finished in by_dir[run_dir] if same_run(c, run.config["resolved"])]
        run.existing = next((p for p, finished in mine if finished), None)
        run.partial = None if run.existing else _furthest([p for p, _ in mine])
    todo = [r for r in runs if r.existing is None]
    resumed = sum(r.partial is not None for r in todo)
    if spec.get("method", "grid") != "grid":
        out(f"fdlit sweep: method {spec['method']!r} runs under wandb agent; locally every combination runs (grid)")
    out(f"fdlit sweep {spec['name']}: {len(runs)} combinations, {len(runs) - len(todo)} finished, {len(todo)} to run"
        + (f" ({resumed} resumed in their own folder)" if resumed else ""))
    if dry_run:
        for i, run in enumerate(runs, 1):
            state = (f"done ({run.existing})" if run.existing else f"resume ({run.partial})" if run.partial
                     else "todo")
            out(f"  [{i}/{len(runs)}] {state:>5}  group={run.group}  fdlit fit {' '.join(run.argv)}")
        return {"total": len(runs), "skipped": len(runs) - len(todo), "ran": 0, "failed": [], "run_dirs": []}
    failed, run_dirs = [], []
    for i, run in enumerate(todo, 1):
        out(f"fdlit sweep: [{i}/{len(todo)}] {run.name}" + (f" (resuming {run.partial})" if run.partial else ""))
        try:
            experiment = Experiment(run.config["cfg"], run.config["parser"], resume_from=run.partial)
            summary = experiment.fit()
            out(format_summary(summary))
            run_dirs.append(experiment.run_path)
        except (ConfigError, NumericalFault) as exc:  # one bad combination does not stop the others
            print(f"fdlit sweep: {run.name} failed: {exc}", file=sys.stderr)
            failed.append(run.name)
    return {"total": len(runs), "skipped": len(runs) - len(todo), "ran": len(todo) - len(failed),
            "failed": failed, "run_dirs": run_dirs}
