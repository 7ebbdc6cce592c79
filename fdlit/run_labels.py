"""How a run directory is named in tables and figures: its method's label (AVG, UWA, sUWA τ=…, the
baselines), what kind of run it is, and which runs are the same experiment. Shared by fdlit.report and
the reports built on it (fdlit.report_adversaries)."""

from __future__ import annotations

import json
from typing import Any

from fdlit.methods.aliases import canonical_class_path
from fdlit.runs.checkpoint import without_noop_sections

SHORT_NAMES = {
    "ProbabilityAveraging": "AVG",
    "UncertaintyWeighted": "UWA",
    "SmoothedUncertaintyWeighted": "sUWA",
}
LOCAL_LABEL = "Local only (no communication)"
REF_LABEL = "Ref."

def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _section(config: dict, name: str) -> dict:
    """A config section, or {} when the run's config.yaml holds something else there."""
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def run_kind(config: dict) -> str:
    mode = _section(config, "federation").get("mode", "fd")
    return {"local_only": "local", "reference": "ref"}.get(mode, "rule") if isinstance(mode, str) else "rule"


def suwa_tau(config: dict) -> float | None:
    """sUWA's temperature τ, or None when the run is not sUWA (or its τ is not a number)."""
    agg = config.get("aggregator")
    if not isinstance(agg, dict) or not canonical_class_path(str(agg.get("class_path", ""))).endswith(
            ".SmoothedUncertaintyWeighted"):
        return None
    init_args = agg.get("init_args")
    return _number(init_args.get("tau")) if isinstance(init_args, dict) else None


def method_label(config: dict) -> str:
    kind = run_kind(config)
    if kind != "rule":  # baselines are labelled as what they are, never as the rule in their config
        return LOCAL_LABEL if kind == "local" else REF_LABEL
    agg = config.get("aggregator") or {}
    # runs written before the methods' rename carry former class paths (fdlit.methods.aliases)
    class_path = canonical_class_path(str(agg.get("class_path", "?")) if isinstance(agg, dict) else str(agg))
    name = class_path.rsplit(".", 1)[-1]
    label = SHORT_NAMES.get(name, name)
    tau = suwa_tau(config)
    if tau is not None:  # the τ study's rows are sUWA at different temperatures; τ = 0 is AVG, τ = 1 UWA
        label = {0.0: f"AVG (sUWA τ={tau:g})", 1.0: f"UWA (sUWA τ={tau:g})"}.get(tau, f"sUWA τ={tau:g}")
    return label


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
