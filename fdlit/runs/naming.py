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
    """Readable name parts: ``tau0.5``, ``k3``, ``avg`` (a class path is named by its class, a swept
    ``config`` file by its stem: ``methods/fedavg.yaml`` -> ``fedavg``, a list of class specs by their
    classes: ``MLP+SmallCNN``)."""
    if key == "config" and isinstance(value, str) and value.endswith((".yaml", ".yml")):
        return safe_name(value.rsplit("/", 1)[-1].rsplit(".", 1)[0])
    if isinstance(value, str) and "." in value and "/" not in value and not value.replace(".", "").isdigit():
        cls = value.rsplit(".", 1)[-1]
        return safe_name(CLASS_ALIASES.get(cls, cls))
    if isinstance(value, dict) and "class_path" in value:
        value = [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) and "class_path" in v for v in value):
        # PerClient's groups -> MLP+SmallCNN: the architectures, not the specs' punctuation
        return safe_name("+".join(dict.fromkeys(str(v["class_path"]).rsplit(".", 1)[-1] for v in value)))
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


# ------------------------------------------------------------------------------- default run names
MAX_READABLE = 48  # characters of the readable part of a default run name (the hash keeps it unique)
SECTION_CLASSES = {  # the fit config's plain sections and the classes whose defaults they hold
    "data": "fdlit.data.FederatedData", "client": "fdlit.clients.ClientOptimization",
    "federation": "fdlit.federation.settings.FederationSettings", "privacy": "fdlit.privacy.UploadPrivacy",
    "adversaries": "fdlit.adversaries.Adversaries", "server": "fdlit.federation.server.ServerModel",
}


def _import(class_path: Any) -> type | None:
    """The class a fit config names (already imported by the parse that checked the config)."""
    import importlib

    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def signature_defaults(cls: type | None) -> dict[str, Any]:
    import inspect

    if cls is None:
        return {}
    try:
        params = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def non_default_settings(config: dict[str, Any]) -> dict[str, Any]:
    """Every setting of a resolved fit config that differs from fdlit's defaults (the classes' own
    defaults; a class section's class path when it is not the parser's default), as dotted keys;
    the seed and how the run is logged and checkpointed left out."""
    out: dict[str, Any] = {}
    class_defaults = {"model": "fdlit.models.SmallCNN", "aggregator": "fdlit.methods.SmoothedUncertaintyWeighted"}
    for section, value in config.items():
        if section in ("seed", "logger", "checkpoint", "config") or not isinstance(value, dict):
            continue
        sections = [(section, value)]
        if section == "server" and isinstance(value.get("model"), dict):
            sections = [(section, {k: v for k, v in value.items() if k != "model"}), ("server.model", value["model"])]
        for name, part in sections:
            if "class_path" in part:
                path = part["class_path"]
                if not _same(path, class_defaults.get(name)):
                    out[name] = path
                defaults, values = signature_defaults(_import(path)), part.get("init_args") or {}
                prefix = f"{name}.init_args."
            else:
                defaults, values, prefix = signature_defaults(_import(SECTION_CLASSES.get(name))), part, f"{name}."
            for key, v in values.items():
                if key in ("input_shape", "num_classes"):  # from the data, never a setting
                    continue
                if key not in defaults or not _same(v, defaults[key]):
                    out[prefix + key] = v
    return out


def setting_digest(config: dict[str, Any]) -> str:
    """The default run name's hash: six hex digits of every setting but the seed, logger and checkpoint."""
    return setting_hash({k: v for k, v in flat(config).items() if not k.startswith("checkpoint.")})


def run_name(config: dict[str, Any], method: str, heterogeneity: str, seed: Any) -> tuple[str, str, dict]:
    """(default run name, setting hash, non-default settings). The name says what the run is and
    what it changed: ``<method>[-<its non-default arguments>]-<k>-<dataset>[-<the model's non-default
    arguments>]-<hash>-seed<seed>`` (``suwa-tau0.5-k2-digits-hidden256x128-1a2b3c-seed0``); the hash
    of every setting but the seed and the logger makes it unique per setting, the readable part is
    cut at ``MAX_READABLE`` characters, and the summary lists every non-default setting in full."""
    differs = non_default_settings(config)
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    method_args = [short(k, v) for k, v in differs.items() if k.startswith("aggregator.init_args.")]
    model_args = [short(k, v) for k, v in differs.items() if k.startswith("model.init_args.")]
    readable = "-".join([method, *method_args, heterogeneity, str(data.get("dataset", "")), *model_args])
    readable = safe_name(readable)[:MAX_READABLE].rstrip("-._")
    digest = setting_digest(config)
    return safe_name(f"{readable}-{digest}-seed{seed}"), digest, differs
