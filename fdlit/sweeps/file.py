"""A W&B sweep file, read locally: checked (every error names its key), and its combinations, a
grid or ``run_cap`` random draws (:mod:`fdlit.sweeps.controller` runs them)."""

from __future__ import annotations

import itertools
import json
import math
import random
import zlib
from pathlib import Path
from typing import Any

from fdlit.configuration.files import read_yaml
from fdlit.errors import ConfigError

METHODS = ("grid", "random", "bayes")
LOCAL_METHODS = ("grid", "random")
# W&B's distributions that a local random sweep samples (W&B infers uniform / int_uniform from min/max)
DISTRIBUTIONS = ("constant", "categorical", "uniform", "int_uniform", "log_uniform_values", "q_uniform")
ARGS_MACRO = "${args}"
MAX_SWEEP_FILE = 2**20  # a sweep file is a few lines of YAML


def load_sweep(path: str | Path) -> dict[str, Any]:
    """Read and check a sweep file; errors name the offending key."""
    path = Path(path)
    if not path.exists():
        raise ConfigError("sweep", f"no sweep file {str(path)!r}")
    if not path.is_file():  # a folder, a device such as /dev/zero, a pipe: refused unread
        raise ConfigError("sweep", f"{str(path)!r} is not a regular file; name a sweep YAML file")
    if path.stat().st_size > MAX_SWEEP_FILE:
        raise ConfigError("sweep", f"{str(path)!r} is larger than {MAX_SWEEP_FILE // 2**20} MiB; a sweep file is a "
                          "short YAML file")
    spec = read_yaml(path, "sweep")  # one line naming the file and line: not UTF-8, not YAML, a key twice, empty
    method = spec.get("method", "grid")
    if method not in METHODS:
        raise ConfigError("method", f"allowed: {', '.join(METHODS)}; got {method!r}")
    params = spec.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ConfigError("parameters", "a non-empty mapping of dotted fit flags is required")
    if method not in LOCAL_METHODS:
        raise ConfigError("method", f"{method!r} needs W&B's sweep server (wandb sweep {path}, then wandb agent); "
                          f"locally allowed: {', '.join(LOCAL_METHODS)}")
    for key, p in params.items():
        if not isinstance(p, dict):
            raise ConfigError(f"parameters.{key}", "must be a mapping such as 'values: [...]' or 'value: x'")
        if "values" in p and (not isinstance(p["values"], list) or not p["values"]):
            raise ConfigError(f"parameters.{key}.values", "must be a non-empty list")
        if "values" in p or "value" in p:
            continue
        if method == "grid":
            raise ConfigError(f"parameters.{key}", "grid sweeps need 'values: [...]' or 'value: x' "
                              "(distributions such as min/max need method: random)")
        distribution = _distribution(p)
        if distribution not in DISTRIBUTIONS:
            raise ConfigError(f"parameters.{key}.distribution",
                              f"allowed locally: {', '.join(DISTRIBUTIONS)}; got {distribution!r}")
        if not all(isinstance(p.get(b), (int, float)) for b in ("min", "max")) or p["min"] > p["max"]:
            raise ConfigError(f"parameters.{key}", "a distribution needs numbers 'min' <= 'max'")
        if distribution == "log_uniform_values" and p["min"] <= 0:
            raise ConfigError(f"parameters.{key}.min", "log_uniform_values needs min > 0")
    if method == "random":
        cap = spec.get("run_cap")
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ConfigError("run_cap", f"method: random needs 'run_cap: <runs>' (a positive integer); got {cap!r}")
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
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*choices)]


def _distribution(p: dict[str, Any]) -> str:
    if "distribution" in p:
        return p["distribution"]
    if "values" in p:
        return "categorical"
    if "value" in p:
        return "constant"
    both_int = all(isinstance(p.get(b), int) and not isinstance(p.get(b), bool) for b in ("min", "max"))
    return "int_uniform" if both_int else "uniform"  # W&B's inference from min/max


def _draw(p: dict[str, Any], rng: random.Random) -> Any:
    kind = _distribution(p)
    if kind == "constant":
        return p["value"]
    if kind == "categorical":
        return p["values"][rng.randrange(len(p["values"]))]
    lo, hi = p["min"], p["max"]
    if kind == "int_uniform":
        return rng.randint(int(lo), int(hi))
    if kind == "log_uniform_values":
        value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    elif kind == "q_uniform":
        q = p.get("q", 1.0)
        value = round(rng.uniform(lo, hi) / q) * q
    else:
        value = rng.uniform(lo, hi)
    return float(f"{value:.4g}")  # 4 significant digits: readable names, and draws stay distinct


def sample_random(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """``run_cap`` distinct combinations drawn as W&B's random search does, from a stream seeded by
    the sweep's name (the same sweep draws the same combinations again, so it resumes); fewer when
    the parameters have fewer distinct combinations."""
    rng = random.Random(zlib.crc32(str(spec["name"]).encode()))
    params = spec["parameters"]
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(100 * spec["run_cap"]):
        if len(out) == spec["run_cap"]:
            break
        values = {k: _draw(p, rng) for k, p in params.items()}
        key = json.dumps(values, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(values)
    return out


def combinations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return sample_random(spec) if spec.get("method", "grid") == "random" else expand_grid(spec)


def agent_flags(values: dict[str, Any]) -> list[str]:
    """``${args}`` exactly as wandb agent expands it: ``--param=value`` with Python's str(value)."""
    return [f"--{k}={v}" for k, v in values.items()]
