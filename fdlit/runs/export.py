"""``python -m fdlit export RUN_DIR [--client i | --server] --out FILE``: a trained network from a run's
checkpoint, to load anywhere with PyTorch alone.

``--format torchscript`` (the default) writes a TorchScript file (``torch.jit.trace`` of the network
in evaluation mode) that holds the dataset's input step too (``fdlit.data.augment.ImageInput``'s
scaling and normalisation; no augmentation), so raw test inputs go in as they are and nothing of
fdlit is needed to load it. Its model card, ``model_card.json``, is inside the file (an extra file of
``torch.jit.save``) and beside it (``FILE`` with the suffix ``.json``): the class labels, the input's
shape and dtype, what the input step does, the network's class and arguments, the run's config and
the model's final metrics. Loading it::

    import json, torch
    files = {"model_card.json": ""}
    net = torch.jit.load("model.pt", _extra_files=files)  # fills ``files`` with the card
    card = json.loads(files["model_card.json"])
    logits = net(x)  # x: a batch of raw inputs of card["input"]["shape"] and card["input"]["dtype"]

``--format state_dict`` writes plain data (``torch.load(FILE, weights_only=True)`` reads it), to
rebuild the network with its class (fdlit importable):

- ``class_path`` and ``init_args``: the network's class and every argument it was built with
  (``input_shape`` and ``num_classes`` resolved from the data; a per-client architecture resolved to
  that client's);
- ``state_dict``: its parameters and buffers, on the CPU;
- ``input``: None, or the dataset's input step the run put in front of the network
  (``{"class_path", "init_args"}``, e.g. ``fdlit.data.augment.ImageInput`` with its ``mean`` and
  ``std``): raw inputs go through it first;
- ``source``: the run directory, the round of the checkpoint, which model (``client 3``, ``server``),
  and a client's own classes.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any, Optional

import torch

from fdlit.configuration.code_allowlist import CodeAllowlist, ImportGuard, check_config_files
from fdlit.errors import ConfigError, check_choice
from fdlit.runs.atomic_write import check_target, write_file
from fdlit.runs.checkpoint import CheckpointError, check_config, load_checkpoint, restore_checkpoint
from fdlit.runs.directory import CHECKPOINT, CONFIG, METRICS, read_config, read_jsonl, read_summary

FORMAT = "fdlit-model"
VERSION = 1
FORMATS = ("torchscript", "state_dict")
CARD = "model_card.json"


def card_path(out: str | Path) -> Path:
    """Where the model card of a TorchScript export goes: beside it, suffix ``.json``."""
    return Path(out).with_suffix(".json")


def export_model(run_dir: str | Path, out: str | Path, client: Optional[int] = None, server: bool = False,
                 trust_config: bool = False, format: str = "torchscript") -> dict:
    """Write the chosen network of ``run_dir``'s checkpoint to ``out``; what was written (without the
    tensors) back. Every argument is checked before the run is rebuilt. The run is rebuilt from its
    config.yaml, whose class paths are imported: unless ``trust_config``, only the classes of fdlit's a
    received config may construct (:data:`EXPORT_ALLOWLIST`)."""
    check_choice("format", format, FORMATS)
    path, out = Path(run_dir), Path(out)
    checkpoint = path / CHECKPOINT
    if path.is_file() and path.suffix == ".pt":  # a kept checkpoint of a run folder (checkpoint-r3.pt)
        checkpoint, path = path, path.parent
    if not path.is_dir() or not (path / CONFIG).exists():
        raise CheckpointError(f"{run_dir!s} is not an fdlit run directory (no {CONFIG})")
    if client is not None and server:
        raise ConfigError("client", "choose one model: --client i or --server")
    if client is not None and (not isinstance(client, int) or isinstance(client, bool) or client < 0):
        raise ConfigError("client", f"must be a client's index, 0 or more; got {client!r}")
    check_target(out, "out")  # a plain file outside any run directory: never the run's checkpoint, never /dev/full
    if format == "torchscript":
        if card_path(out) == out:
            raise ConfigError("out", f"the model card goes beside the model as {card_path(out).name}: give the model "
                              f"another suffix, e.g. {out.with_suffix('.pt').name}; got {str(out)!r}")
        check_target(card_path(out), "out")
    if not trust_config:
        from fdlit.runs.experiment import current_names

        with current_names(path, say=False) as config:  # a run saved with the methods' former names: read in current
            check_config_files([config], EXPORT_ALLOWLIST)  # with its layers and section files, nothing imported
    offer = (f"export it with: python -m fdlit export {{kept}} {'--server' if server else f'--client {client}'} "
             f"--out {out}", f"nothing intact is left to export; train it again with: python -m fdlit fit --config "
             f"{path / CONFIG}")
    state = load_checkpoint(checkpoint, "run_dir", offer)
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

    loop = _trained_loop(path, state, trust_config)
    if server:
        module, spec, which, classes = loop.server_side.server_model.net, resolved(loop.server_side.server_model.spec, loop), "server", None
    else:
        module = loop.parts.clients.clients[client].model
        spec = resolved(loop.model_spec, loop, client)
        which, classes = f"client {client}", [int(c) for c in loop.parts.clients.client_data[client].classes]
    net, input_module = (module.net, module.input) if hasattr(module, "net") and hasattr(module, "input") else (module, None)
    source = {"run_dir": str(path.resolve()), "round": int(loop_state["round"]), "model": which, "classes": classes}
    if format == "torchscript":
        card = model_card(loop, path, spec, describe_input(input_module), source, client)
        scripted = traced(module, loop.data.test.x[:8])
        text = json.dumps(card, indent=2, default=str)
        write_file(out, lambda f: torch.jit.save(scripted, f, _extra_files={CARD: text}), "out")
        write_file(card_path(out), text + "\n", "out")
        return {"format": "torchscript", **spec, "source": source, "card": card_path(out)}
    exported = {
        "format": FORMAT, "version": VERSION, **spec,
        "state_dict": {k: v.detach().cpu().clone() for k, v in net.state_dict().items()},
        "input": describe_input(input_module),
        "source": source,
    }
    write_file(out, lambda f: torch.save(exported, f), "out")  # a reader never sees half a file
    return {k: v for k, v in exported.items() if k != "state_dict"}


def traced(module: torch.nn.Module, example: torch.Tensor) -> torch.jit.ScriptModule:
    """The network with its input step, in evaluation mode on the CPU, as TorchScript; checked to give
    the module's own outputs on ``example`` (raw inputs of the dataset's dtype)."""
    net = copy.deepcopy(module).cpu().eval()
    example = example.cpu()
    with torch.no_grad():
        scripted = torch.jit.trace(net, example, check_trace=False)
        expected, got = net(example), scripted(example)
    if not torch.allclose(expected, got, rtol=0, atol=1e-6):
        raise RuntimeError(f"the traced network differs from the trained one by {(expected - got).abs().max():.3g}; "
                           "export it with --format state_dict")
    return scripted


def model_card(loop, path: Path, spec: dict, input_step: Optional[dict], source: dict,
               client: Optional[int]) -> dict[str, Any]:
    """What a user of the exported file needs to feed it and to know what it is."""
    from fdlit.data.class_names import at_load, class_names

    x = loop.data.test.x
    loaded = at_load(loop.data.dataset)  # digits: fdlit divides the 0..16 pixels by 16 as it loads them
    if input_step is None:
        preprocessing = (f"{loaded}; nothing else (no input step in the file)" if loaded else
                         "none: the network takes the dataset's inputs as they are")
    else:
        scaled = "pixels / 255, then " if x.dtype == torch.uint8 else ""
        preprocessing = (f"{loaded + '; then ' if loaded else ''}included in the file ({input_step['class_path']}, "
                         f"traced for {x.dtype} inputs as the dataset stores them): {scaled}(x - mean) / std per "
                         "channel; no augmentation")
    return {
        "format": "fdlit-model-card", "version": VERSION, "model": source["model"], "round": source["round"],
        "run_dir": source["run_dir"],
        "classes": class_names(loop.data.dataset, loop.data.num_classes),  # index i names label i
        "client_classes": source["classes"],
        "input": {"shape": [None, *map(int, loop.data.input_shape)], "dtype": str(x.dtype).removeprefix("torch."),
                  "preprocessing": preprocessing, "input_step": input_step},
        "output": f"logits, shape [batch, {loop.data.num_classes}]; argmax is the predicted class",
        "network": spec,
        "config": read_config(path),
        "metrics": final_metrics(path, client),
    }


def final_metrics(path: Path, client: Optional[int]) -> dict[str, Any]:
    """The model's accuracies in the run's last evaluated round (a client's own entries of the
    per-client lists; the server's ``server/*``), and the run's summary numbers."""
    rows = read_jsonl(path / METRICS)  # within bounds: a damaged or too deeply nested line is skipped
    rows = [r for r in rows if r.get("eval/test_samples", 1)]
    last = rows[-1] if rows else {}
    mine: dict[str, Any] = {"round": last.get("round")}
    for key, value in last.items():
        if client is not None and key.startswith("clients/") and isinstance(value, list) and client < len(value):
            mine[key.removeprefix("clients/")] = value[client]
        elif client is None and key.startswith("server/"):
            mine[key] = value
    try:
        summary = read_summary(path)
    except (OSError, ValueError):  # none yet, or one fdlit cannot read: the card has no summary numbers
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    mine["run"] = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return mine


# a run's config.yaml may name only the classes of fdlit's listed in fdlit.configuration.constructible (any spelling)
EXPORT_ALLOWLIST = CodeAllowlist((), "{name!r} in {file} {what}; export constructs only fdlit's methods, models, "
                                 "executors, attacks, clients and callbacks from a run's config.yaml. If you trust "
                                 "this run folder and its code, add --trust_config")


def _trained_loop(path: Path, state: dict[str, Any], trust_config: bool = False):
    """The run's loop, rebuilt from its config with the checkpoint's state loaded (clients in this
    process: the sequential executor, whatever the run used)."""
    from fdlit.configuration.schema import parse_fit
    from fdlit.execution import SequentialExecutor
    from fdlit.runs.experiment import Experiment, current_names, legacy_name

    with contextlib.nullcontext() if trust_config else ImportGuard(EXPORT_ALLOWLIST), current_names(path, False) as file:
        parser, cfg = parse_fit(["--config", str(file), *legacy_name(path), "--logger.mode", "disabled"],
                                None if trust_config else EXPORT_ALLOWLIST)
        config = cfg.clone().as_dict()  # as Experiment keeps it, compared before anything of it is constructed
        config.pop("config", None)
        try:
            check_config(config, cfg.federation.rounds, state)  # a config.yaml edited since the run is refused
        except CheckpointError as exc:
            raise CheckpointError(f"{path / CONFIG} differs from the config its checkpoint was written with (edited "
                                  "since the run?); export needs the config.yaml the run saved", "run_dir") from exc
        experiment = Experiment(cfg, parser, resume_from=path)
    loop = experiment.loop
    loop.settings.executor = SequentialExecutor()
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
