"""The methods' former names, in one table: a config that names one is refused with the current name,
and a run directory written with one resumes under the current name.

The methods' package was ``fdlit.aggregators`` and most classes ended in ``Aggregator``; FedMD's
digest was a client class (``federation.client_class``) before it was FedMD's client part. Nothing
imports under a former name: this table only words the refusal (``aggregator:
fdlit.aggregators.MetaModelAggregator was renamed; write fdlit.methods.MetaModel``), translates a
saved run's config, and lets reports label old runs by current names.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product
from typing import Any

import yaml

from fdlit.errors import ConfigError

OLD_PACKAGE, PACKAGE = "fdlit.aggregators", "fdlit.methods"
# former class name -> current class name (the others kept theirs: FedAvg, FedDF, FedProx, Scaffold, ...)
RENAMED = {
    "ProbabilityAveragingAggregator": "ProbabilityAveraging",
    "UncertaintyWeightedAggregator": "UncertaintyWeighted",
    "SmoothedUncertaintyWeightedAggregator": "SmoothedUncertaintyWeighted",
    "EntropyWeightedAggregator": "EntropyWeighted",
    "EntropyReductionAggregator": "EntropyReduction",
    "LogitAveragingAggregator": "LogitAveraging",
    "LogitVarianceAggregator": "LogitVariance",
    "MetaModelAggregator": "MetaModel",
    "SelectiveFDAggregator": "SelectiveFD",
    "FedMDAggregator": "FedMD",
    "FedGOAggregator": "FedGO",
    "F2LAggregator": "F2L",
    "LKDAggregator": "LKD",
    "OracleAggregator": "Oracle",
}
# former class paths that became another class: FedMD's client part digests on the plain client
MOVED = {
    "fdlit.methods.FedMDClient": "fdlit.clients.ClientModule",
    "fdlit.methods.fedmd_client.FedMDClient": "fdlit.clients.ClientModule",
}
# the config fields whose value names a class (``x.Y`` or ``{class_path: x.Y}``), besides any ``class_path``
CLASS_FIELDS = ("model", "server.model", "aggregator", "federation.executor", "federation.callbacks",
                "federation.client_class", "federation.clock")


def current_name(name: str) -> str | None:
    """The current spelling of a former class path or class name
    (``fdlit.aggregators.SmoothedUncertaintyWeightedAggregator`` ->
    ``fdlit.methods.SmoothedUncertaintyWeighted``, ``MetaModelAggregator`` -> ``MetaModel``); None when
    ``name`` is no former name."""
    name = name.strip()
    module, _, cls = name.rpartition(".")
    if module == OLD_PACKAGE or module.startswith(OLD_PACKAGE + "."):
        module = PACKAGE + module[len(OLD_PACKAGE):]
    if not module or module == PACKAGE or module.startswith(PACKAGE + "."):
        cls = RENAMED.get(cls, cls)
    new = f"{module}.{cls}" if module else cls
    new = MOVED.get(new, new)
    return new if new != name else None


def current_spelling(name: str) -> str:
    """``name`` in current names (unchanged when it is no former name)."""
    return current_name(name) or name


def former_spellings(name: str) -> list[str]:
    """Every former spelling of the current class path ``name`` (none for a class that kept its name and
    module outside the methods' package)."""
    module, _, cls = name.rpartition(".")
    moved = [old for old, new in MOVED.items() if new == name]
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return moved
    modules = [module, OLD_PACKAGE + module[len(PACKAGE):]]
    classes = [cls, *(old for old, new in RENAMED.items() if new == cls)]
    return moved + [f"{m}.{c}" for m, c in product(modules, classes) if f"{m}.{c}" != name]


def class_names(value: Any, at: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every (key path, class name) a config (or a part of it at ``at``) names: each ``class_path`` and
    each class field given as a name, in lists too."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from class_names(v, (*at, *str(k).split(".")))
    elif isinstance(value, list):
        for item in value:
            yield from class_names(item, at)
    elif isinstance(value, str) and names_a_class(at):
        yield at, value


def names_a_class(at: tuple[str, ...]) -> bool:
    """Whether the value at key path ``at`` names a class: a ``class_path``, or a class field's value."""
    return bool(at) and at[-1] == "class_path" or ".".join(p for p in at if p != "init_args") in CLASS_FIELDS


def refuse_former_name(key: str, value: Any) -> None:
    """One line for a class field or ``class_path`` that names a class by a former name."""
    if isinstance(value, str):
        new = current_name(value)
        if new is not None:
            raise ConfigError(key, f"{value.strip()} was renamed; write {new}")


def refuse_former_names_in_arguments(argv: list[str]) -> None:
    """Refuse a former name a command-line option gives (``--aggregator X``, ``--aggregator.class_path=X``,
    ``--aggregator '{class_path: X}'``); the arguments are within bounds already (``check_arguments``)."""
    for i, arg in enumerate(argv):
        if not arg.startswith("--") or arg == "--config" or arg.startswith("--config="):
            continue
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            key, value = arg[2:], argv[i + 1]
        else:
            continue
        at = tuple(key.split("."))
        if value.lstrip()[:1] in ("{", "["):  # a section as YAML text
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                continue  # not YAML: the parser words it
        for path, name in class_names(value, at):
            refuse_former_name(".".join(path), name)


def translated(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """A saved run's ``config`` in current names, and what changed: dotted key -> (former, current)."""
    changed: dict[str, tuple[str, str]] = {}

    def walk(value: Any, at: tuple[str, ...]) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, (*at, *str(k).split("."))) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, at) for v in value]
        if isinstance(value, str) and names_a_class(at):
            new = current_name(value)
            if new is not None:
                changed[".".join(at)] = (value, new)
                return new
        return value

    return walk(config, ()), changed


def former_configs(config: dict[str, Any], limit: int = 64) -> Iterator[dict[str, Any]]:
    """``config`` as a run written before the renames may have saved it: each combination of the
    former spellings of the classes it names (at most ``limit``), for the checkpoint's fingerprint."""
    spots = [(path, former_spellings(name)) for path, name in class_names(config)]
    spots = [(path, olds) for path, olds in spots if olds]
    for n, choice in enumerate(product(*([None, *olds] for _, olds in spots))):
        if n >= limit:
            return
        if any(c is not None for c in choice):
            yield _with(config, {path: old for (path, _), old in zip(spots, choice, strict=True) if old is not None})


def _with(config: Any, values: dict[tuple[str, ...], str], at: tuple[str, ...] = ()) -> Any:
    if at in values and isinstance(config, str):
        return values[at]
    if isinstance(config, dict):
        return {k: _with(v, values, (*at, *str(k).split("."))) for k, v in config.items()}
    if isinstance(config, list):
        return [_with(v, values, at) for v in config]
    return config
