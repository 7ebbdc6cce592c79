"""``python -m fdlit export RUN_DIR [--client i | --server] --out FILE``: a trained network from a run's
checkpoint, to load anywhere with plain PyTorch.

The file (``torch.save``; ``torch.load(FILE, weights_only=True)`` reads it) holds plain data only:

- ``class_path`` and ``init_args``: the network's class and every argument it was built with
  (``input_shape`` and ``num_classes`` resolved from the data; a per-client architecture resolved to
  that client's);
- ``state_dict``: its parameters and buffers, on the CPU;
- ``input``: None, or the dataset's input step the run put in front of the network
  (``{"class_path", "init_args"}``, e.g. ``fdlit.data.augment.ImageInput`` with its ``mean`` and
  ``std``): raw inputs go through it first;
- ``source``: the run directory, the round of the checkpoint, which model (``client 3``, ``server``),
  and a client's own classes.

Loading it::

    state = torch.load("model.pt", weights_only=True)
    module, _, name = state["class_path"].rpartition(".")
    net = getattr(importlib.import_module(module), name)(**state["init_args"])
    net.load_state_dict(state["state_dict"])
    net.eval()
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any, Optional

import torch

from fdlit.errors import ConfigError
from fdlit.runs.atomic_write import check_target, write_file
from fdlit.runs.checkpoint import CheckpointError, check_config, load_checkpoint, restore_checkpoint
from fdlit.runs.directory import CHECKPOINT, CONFIG, read_config

FORMAT = "fdlit-model"
VERSION = 1


def export_model(run_dir: str | Path, out: str | Path, client: Optional[int] = None, server: bool = False,
                 trust_config: bool = False) -> dict:
    """Write the chosen network of ``run_dir``'s checkpoint to ``out``; what was written (without the
    tensors) back. Every argument is checked before the run is rebuilt. The run is rebuilt from its
    config.yaml, whose class paths are imported: unless ``trust_config``, only fdlit's own classes
    (:func:`check_trusted`)."""
    path, out = Path(run_dir), Path(out)
    if not path.is_dir() or not (path / CONFIG).exists():
        raise CheckpointError(f"{run_dir!s} is not an fdlit run directory (no {CONFIG})")
    if client is not None and server:
        raise ConfigError("client", "choose one model: --client i or --server")
    if client is not None and (not isinstance(client, int) or isinstance(client, bool) or client < 0):
        raise ConfigError("client", f"must be a client's index, 0 or more; got {client!r}")
    check_target(out, "out")  # a plain file outside any run directory: never the run's checkpoint, never /dev/full
    if not trust_config:
        check_trusted(read_config(path), path / CONFIG)
    state = load_checkpoint(path / CHECKPOINT)
    loop_state = state["loop"]
    clients = loop_state["num_clients"]
    if server and loop_state.get("server") is None:
        raise ConfigError("server", f"this run has no server model (server.model); export a client with "
                          f"--client 0..{clients - 1}")
    if not server and client is None:
        hint = "--server (its server model) or " if loop_state.get("server") is not None else ""
        raise ConfigError("client", f"choose the model to export: {hint}--client 0..{clients - 1}")
    if not server and not (isinstance(client, int) and 0 <= client < clients):
        raise ConfigError("client", f"the run has {clients} client(s): 0..{clients - 1}; got {client!r}")

    loop = _trained_loop(path, state)
    if server:
        module, spec, which, classes = loop.server.net, resolved(loop.server.spec, loop), "server", None
    else:
        module = loop.clients[client].model
        spec = resolved(loop.model_spec, loop, client)
        which, classes = f"client {client}", [int(c) for c in loop.client_data[client].classes]
    net, input_module = (module.net, module.input) if hasattr(module, "net") and hasattr(module, "input") else (module, None)
    exported = {
        "format": FORMAT, "version": VERSION, **spec,
        "state_dict": {k: v.detach().cpu().clone() for k, v in net.state_dict().items()},
        "input": describe_input(input_module),
        "source": {"run_dir": str(path.resolve()), "round": int(loop_state["round"]), "model": which,
                   "classes": classes},
    }
    write_file(out, lambda f: torch.save(exported, f), "out")  # a reader never sees half a file
    return {k: v for k, v in exported.items() if k != "state_dict"}


DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def check_trusted(config: Any, where: Path, key: str = "") -> None:
    """Refuse a run config that names code outside fdlit, before anything of it is imported: a
    ``class_path`` that is not a class defined in fdlit, and any dotted name whose first part is a
    module Python would find (``evilmod.Net`` beside ``evilmod.py``); looked up without importing."""
    if isinstance(config, dict):
        for k, v in config.items():
            if not key and k == "logger":
                continue  # names and folders: nothing in it is imported
            name = f"{key}.{k}" if key else str(k)
            if k == "class_path" and not (isinstance(v, str) and _fdlit_class(v)):
                _refuse(name, v, where)
            check_trusted(v, where, name)
    elif isinstance(config, list):
        for i, v in enumerate(config):
            check_trusted(v, where, f"{key}[{i}]")
    elif isinstance(config, str) and DOTTED.fullmatch(config):
        top = config.split(".", 1)[0]
        if (top == "fdlit" and not _fdlit_class(config)) or (top != "fdlit" and _findable(top)):
            _refuse(key, config, where)


def _refuse(key: str, value: Any, where: Path) -> None:
    raise ConfigError(key or "config", f"{value!r} in {where} is not a class of fdlit; export imports only fdlit's "
                      "own classes from a run's config.yaml. If you trust this run folder and its code, add "
                      "--trust_config")


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None  # finds the file, runs nothing
    except (ImportError, ValueError):
        return False


def _fdlit_class(path: str) -> bool:
    """Whether ``path`` names a class defined in fdlit (fdlit's modules are imported to look)."""
    if not DOTTED.fullmatch(path) or path.split(".", 1)[0] != "fdlit":
        return False
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return isinstance(obj, type) and obj.__module__.split(".", 1)[0] == "fdlit"
    return False


def _trained_loop(path: Path, state: dict[str, Any]):
    """The run's loop, rebuilt from its config with the checkpoint's state loaded (clients in this
    process: the sequential executor, whatever the run used)."""
    from fdlit.config import parse_fit
    from fdlit.execution import SequentialExecutor
    from fdlit.runs.experiment import Experiment, legacy_name

    parser, cfg = parse_fit(["--config", str(path / CONFIG), *legacy_name(path), "--logger.mode", "disabled"])
    experiment = Experiment(cfg, parser, resume_from=path)
    check_config(experiment.config, experiment.loop.rounds, state)  # a config.yaml edited since is refused
    loop = experiment.loop
    loop.executor = SequentialExecutor()
    restore_checkpoint(loop, state)
    return loop


def resolved(spec: dict, loop, client: int = 0) -> dict:
    """``class_path`` and every ``init_args`` of the network ``spec`` made for ``client``."""
    from fdlit.models.build import resolve_model

    cls, kwargs = resolve_model(spec, loop.data.input_shape, loop.data.num_classes, client, len(loop.data.clients))
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": kwargs}


def describe_input(module: Optional[torch.nn.Module]) -> Optional[dict]:
    """The input step in front of the network as class path and arguments (evaluation mode: no
    augmentation)."""
    if module is None:
        return None
    cls = type(module)
    args: dict[str, Any] = {}
    for name in ("mean", "std"):
        value = getattr(module, name, None)
        if isinstance(value, torch.Tensor):
            args[name] = [float(v) for v in value.flatten()]
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": args}
