"""How a run directory is named in tables and figures: its method's label (AVG, UWA, sUWA τ=…, the
baselines), what kind of run it is, and which runs are the same experiment.

A method's label is its class's own ``label`` (:class:`fdlit.methods.Aggregator`; its class name
when None). The class is found by name among the classes :mod:`fdlit.methods` exports, never
imported from the class path a run folder holds: a run folder is data, and reading it runs no
code. A class path outside fdlit's methods is labelled by its last dotted part, as text."""

from __future__ import annotations

import functools
import json
from typing import Any

from fdlit.configuration.former_names import PACKAGE, current_spelling
from fdlit.runs.checkpoint import without_noop_sections

LOCAL_LABEL = "Local only (no communication)"
REF_LABEL = "Ref."


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _section(config: dict, name: str) -> dict:
    """A config section, or {} when the run's config.yaml holds something else there."""
    value = config.get(name)
    return value if isinstance(value, dict) else {}


@functools.cache
def method_classes() -> dict[str, type]:
    """Class name -> class of every method :mod:`fdlit.methods` exports (already imported with it)."""
    import fdlit.methods as methods
    from fdlit.methods.base import Aggregator

    found = {name: vars(methods).get(name) for name in methods.__all__}
    return {name: cls for name, cls in found.items() if isinstance(cls, type) and issubclass(cls, Aggregator)}


def method_class(class_path: Any) -> type | None:
    """The fdlit method a class path names (former names included), or None: looked up, not imported."""
    if not isinstance(class_path, str):
        return None
    module, _, name = current_spelling(class_path).rpartition(".")
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    return method_classes().get(name)


def _class_path(config: dict) -> str:
    agg = config.get("aggregator")
    return str(agg.get("class_path", "?")) if isinstance(agg, dict) else str(agg)


def run_kind(config: dict) -> str:
    mode = _section(config, "federation").get("mode", "fd")
    return {"local_only": "local", "reference": "ref"}.get(mode, "rule") if isinstance(mode, str) else "rule"


def suwa_tau(config: dict) -> float | None:
    """sUWA's temperature τ, or None when the run is not sUWA (or its τ is not a number)."""
    from fdlit.methods import SmoothedUncertaintyWeighted

    agg = config.get("aggregator")
    if not isinstance(agg, dict) or method_class(agg.get("class_path")) is not SmoothedUncertaintyWeighted:
        return None
    init_args = agg.get("init_args")
    return _number(init_args.get("tau")) if isinstance(init_args, dict) else None


def method_label(config: dict) -> str:
    kind = run_kind(config)
    if kind != "rule":  # baselines are labelled as what they are, never as the rule in their config
        return LOCAL_LABEL if kind == "local" else REF_LABEL
    # runs written before the methods' rename carry former class paths (fdlit.configuration.former_names)
    class_path = current_spelling(_class_path(config))
    cls = method_class(class_path)
    label = (cls.label or cls.__name__) if cls is not None else class_path.rsplit(".", 1)[-1]
    if cls is not None and cls.server_label and _section(_section(config, "server"), "model").get("class_path"):
        label = cls.server_label
    tau = suwa_tau(config)
    if tau is not None:  # the τ study's rows are sUWA at different temperatures; τ = 0 is AVG, τ = 1 UWA
        label = {0.0: f"AVG (sUWA τ={tau:g})", 1.0: f"UWA (sUWA τ={tau:g})"}.get(tau, f"sUWA τ={tau:g}")
    return label + clock_label(config, getattr(cls, "exchange", None))


def clock_label(config: dict, exchange: str | None = None) -> str:
    """How a run's rounds were timed (``federation.clock``), as a label's suffix: synchronous, with a
    deadline, asynchronous with a buffer or a period (a parameter ``exchange``'s server update: FedBuff
    when the config leaves it null); "" without a clock."""
    clock = _section(_section(config, "federation"), "clock")
    kind = str(clock.get("class_path", "")).rsplit(".", 1)[-1]
    args = _section(clock, "init_args")
    if kind == "SynchronousClock":
        deadline = _number(args.get("deadline"))
        return f", sync deadline {deadline:g} s" if deadline is not None else ", sync"
    if kind == "AsynchronousClock":
        buffer, period = _number(args.get("buffer")), _number(args.get("period"))
        staleness = str(_section(args, "staleness").get("class_path", "Constant")).rsplit(".", 1)[-1].lower()
        when = f"period {period:g} s" if period is not None else f"buffer {buffer:g}" if buffer is not None else "buffer M"
        update = _section(args, "server_update") or ({"class_path": "FedBuff"} if exchange == "parameters" else {})
        return f", async {when}, {staleness}" + server_update_label(update)
    return ""


def server_update_label(update: dict) -> str:
    """A parameter exchange's asynchronous server update, as a label's suffix ("" for none)."""
    kind = str(update.get("class_path", "")).rsplit(".", 1)[-1]
    args = _section(update, "init_args")
    if kind not in ("FedAsync", "FedBuff"):
        return ""
    name, default = ("alpha", 0.6) if kind == "FedAsync" else ("server_lr", 1.0)
    value = _number(args.get(name))
    return f", {kind} {'α' if kind == 'FedAsync' else 'η'}={value if value is not None else default:g}"


def setting_key(config: dict) -> str:
    """What makes two runs the same experiment: the whole config but the logger (name, folder, W&B)
    and the sections that change nothing (a run saved before such a section existed is the same)."""
    config = without_noop_sections(config)
    return json.dumps({k: v for k, v in config.items() if k not in ("logger", "config")}, sort_keys=True, default=str)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}
