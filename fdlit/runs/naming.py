"""Short, folder-safe names for settings: ``tau0.5``, ``k3``, ``suwa`` (shared by sweeps and W&B)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fdlit.runs.directory import safe_name

KEY_ALIASES = {"classes_per_client": "k", "dirichlet_alpha": "alpha", "num_clients": "M"}
CLASS_ALIASES = {"ProbabilityAveraging": "avg", "UncertaintyWeighted": "uwa",
                 "SmoothedUncertaintyWeighted": "suwa"}


def short(key: str, value: Any) -> str:
    """Readable name parts: ``tau0.5``, ``k3``, ``avg`` (a class path is named by its class)."""
    if isinstance(value, str) and "." in value and "/" not in value and not value.replace(".", "").isdigit():
        cls = value.rsplit(".", 1)[-1]
        return safe_name(CLASS_ALIASES.get(cls, cls))
    last = key.rsplit(".", 1)[-1]
    if isinstance(value, (list, tuple)):  # model.hidden=[64, 64] -> hidden64x64
        value = "x".join(str(v) for v in value)
    return safe_name(f"{KEY_ALIASES.get(last, last)}{value}")  # "org/model" must not become a subfolder


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested fit config as its dotted flags: ``{"data.classes_per_client": 2, "aggregator":
    "<class path>", "aggregator.tau": 0.5}``, the names ``wandb agent`` passes, so a swept key and the
    recorded key are one key and a swept class keeps its ``init_args``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and "class_path" in value:
            out[name] = value["class_path"]
            out.update(flat(value.get("init_args") or {}, f"{name}."))
        elif isinstance(value, dict) and value:
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def setting_hash(flat_config: dict[str, Any]) -> str:
    """Six hex digits of every setting but the seed and how the run is logged: seeds share it."""
    kept = {k: v for k, v in flat_config.items() if k != "seed" and not k.startswith("logger.")}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:6]
