"""Checkpoints and resume (issue 6): a killed run continues from its last complete round.

``<run_dir>/checkpoint.pt`` is rewritten at the end of every round, atomically (write
``checkpoint.pt.tmp``, fsync, rename), so the previous checkpoint stays intact until the new one is
complete. It holds tensors and plain data only (dicts, lists, tuples, numbers, strings), and is
loaded with ``torch.load(weights_only=True)``: a file holding any other pickled object is refused,
so loading a checkpoint can never run code.

Contents: every client's weights, optimizer state and random generator; the aggregator's state
(if it has ``state_dict``/``load_state_dict``); the python, numpy, torch (and CUDA) random states;
the round number; the communication ledger; the metrics history; wall time; the W&B run id; and a
fingerprint of the config that produced it.

Resuming (``fdlit fit --resume <run_dir>``) rebuilds the loop from ``<run_dir>/config.yaml``, loads
this file into it after set-up, drops rows of ``metrics.jsonl`` / ``communication.jsonl`` written
after the checkpoint (a kill between the two writes), and continues with round ``round + 1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fdlit.callbacks import FederationCallback
from fdlit.errors import ConfigError
from fdlit.loggers.run_directory import read_jsonl, write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from fdlit.federation.loop import FederationLoop

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT = "fdlit-checkpoint"
VERSION = 1
# config keys that may differ between the run that wrote a checkpoint and the run resuming it
RESUMABLE_CHANGES = ("federation.rounds", "logger")


class CheckpointError(ConfigError):
    """A checkpoint or run directory cannot be resumed; the message says why."""

    def __init__(self, message: str):
        super().__init__("resume", message)


# ---------------------------------------------------------------------------------- fingerprints
def config_fingerprint(config: dict[str, Any]) -> str:
    """sha256 of the resolved config, without the keys a resume may change (rounds, logger)."""
    cfg = json.loads(json.dumps(config, default=str))
    cfg.pop("logger", None)
    cfg.pop("config", None)
    if isinstance(cfg.get("federation"), dict):
        cfg["federation"].pop("rounds", None)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------- random states
def rng_state() -> dict[str, Any]:
    """Global random states as tensors and plain data (numpy's array becomes an int64 tensor)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------- save / load
def _wandb_run_id(loop: "FederationLoop") -> str | None:
    for cb in getattr(loop, "callbacks", []):
        run = getattr(cb, "run", None)
        if run is not None and type(cb).__name__ == "WandbLogger":
            try:
                return str(run.id)
            except Exception:  # a broken tracker must not stop the checkpoint
                return None
    return getattr(loop, "wandb_run_id", None)


def checkpoint_state(loop: "FederationLoop") -> dict[str, Any]:
    aggregator_state = loop.aggregator.state_dict() if hasattr(loop.aggregator, "state_dict") else None
    return {
        "format": FORMAT,
        "version": VERSION,
        "round": loop.round,
        "rounds": loop.rounds,
        "seed": loop.seed,
        "num_clients": len(loop.clients),
        "config_sha256": config_fingerprint(loop.config),
        # the executor knows where client state lives (in-process, or in Ray actors)
        "clients": loop.executor.fetch_states(loop.clients),
        "aggregator": aggregator_state,
        "rng": rng_state(),
        "ledger": loop.ledger.state_dict(),
        "history": [dict(m) for m in loop.history],
        # the loop updates wall_time after on_round_end; measure it here so it includes this round
        "wall_time": time.perf_counter() - loop._fit_start if hasattr(loop, "_fit_start") else float(loop.wall_time),
        "wandb_run_id": _wandb_run_id(loop),
    }


def save_checkpoint(loop: "FederationLoop", path: Path) -> Path:
    """Write the loop's state to ``path`` atomically: a kill at any moment leaves either the old
    or the new checkpoint, never a torn one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(checkpoint_state(loop), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable (power loss); not possible on every filesystem
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; refuse pickled objects and foreign files."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path} (no round of that run completed?)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = next((ln.strip() for ln in str(exc).splitlines() if "GLOBAL" in ln), str(exc).splitlines()[0])
        raise CheckpointError(
            f"refusing to load {path}: it contains a pickled object, not only tensors and plain data ({detail})"
        ) from None
    except Exception as exc:  # truncated, not a torch file, ...
        raise CheckpointError(f"{path} is not a readable fdlit checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an fdlit checkpoint (no format marker {FORMAT!r})")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {state.get('version')}; this fdlit reads {VERSION}")
    return state


def check_resumable(loop: "FederationLoop", state: dict[str, Any]) -> None:
    """Refuse a checkpoint that does not fit the loop, before anything is written."""
    if state["config_sha256"] != config_fingerprint(loop.config):
        raise CheckpointError(
            "the checkpoint was written by a different config; only "
            f"{', '.join(RESUMABLE_CHANGES)} may change when resuming"
        )
    if state["num_clients"] != len(loop.clients):
        raise CheckpointError(f"checkpoint has {state['num_clients']} clients, the config {len(loop.clients)}")
    if state["round"] > loop.rounds:
        raise CheckpointError(
            f"checkpoint is at round {state['round']}, beyond federation.rounds = {loop.rounds}"
        )


def restore_checkpoint(loop: "FederationLoop", state: dict[str, Any]) -> None:
    """Load ``state`` into a set-up loop (clients built, callbacks created, nothing trained)."""
    check_resumable(loop, state)
    print(f"fdlit: resuming {loop.run_path} after round {state['round']} of {loop.rounds}", file=sys.stderr)
    for client, client_state in zip(loop.clients, state["clients"]):
        client.load_client_state(client_state)
    loop.executor.push_states(loop.clients)
    if state["aggregator"] is not None:
        loop.aggregator.load_state_dict(state["aggregator"])
    loop.ledger.load_state_dict(state["ledger"])
    loop.history = [dict(m) for m in state["history"]]
    loop.round = state["round"]
    loop.wall_time = state["wall_time"]
    loop.wandb_run_id = state["wandb_run_id"]
    _truncate_run_directory(loop, state["round"])
    set_rng_state(state["rng"])  # last: nothing after this may draw random numbers before round r+1


def _truncate_run_directory(loop: "FederationLoop", round: int) -> None:
    """Drop rows written after the checkpoint (a kill between the metrics and checkpoint writes)
    and a torn last line, so resumed rounds append to exactly the checkpointed history."""
    for name in ("metrics.jsonl", "communication.jsonl"):
        path = Path(loop.run_path) / name
        if not path.exists():
            continue
        rows = [row for row in read_jsonl(path) if row.get("round", 0) <= round]
        write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))
    for cb in loop.callbacks:
        if type(cb).__name__ == "RunDirectory":  # it appends only messages it has not written yet
            cb._messages_written = len(loop.ledger.messages)


class Checkpointer(FederationCallback):
    """Writes ``<run_dir>/checkpoint.pt`` at the end of every round. The loop puts it after every
    other callback, so the saved random state is the one the next round starts from."""

    def on_round_end(self, loop, round, metrics):
        save_checkpoint(loop, Path(loop.run_path) / CHECKPOINT_NAME)


def resume_state(loop: "FederationLoop") -> dict[str, Any]:
    """Read ``loop.resume_from``'s checkpoint and check it fits the loop (before anything is written)."""
    run_dir = Path(loop.resume_from)
    if not run_dir.is_dir():
        raise CheckpointError(f"no run directory {str(run_dir)!r}")
    state = load_checkpoint(run_dir / CHECKPOINT_NAME)
    check_resumable(loop, state)
    return state

# ---------------------------------------------------------------------------------- command line
# flags that may accompany --resume: more rounds, and how to log; everything else comes from the run
RESUME_FLAGS = ("--federation.rounds", "--logger.mode", "--logger.progress")


def split_resume(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take ``--resume RUN_DIR`` (or ``--resume=RUN_DIR``) out of ``fit``'s arguments."""
    rest, run_dir = [], None
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if arg == "--resume":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise CheckpointError("--resume needs a run directory, e.g. --resume runs/<timestamp>-<name>")
            run_dir = argv[i + 1]
            next(it, None)
        elif arg.startswith("--resume="):
            run_dir = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return run_dir, rest


def resume_loop(run_dir: str, overrides: list[str]):
    """Rebuild the loop of ``run_dir`` from its config.yaml with the same parser as ``fit``."""
    from fdlit.cli import build_loop, parse_fit  # the CLI imports this module

    for arg in overrides:
        if arg.startswith("-") and arg.split("=", 1)[0] not in RESUME_FLAGS:
            raise CheckpointError(
                f"{arg.split('=', 1)[0]} cannot be changed when resuming (config and seed come from the run "
                f"directory); allowed with --resume: {', '.join(RESUME_FLAGS)}"
            )
    path = Path(run_dir)
    if not path.is_dir():
        raise CheckpointError(f"no run directory {run_dir!r}")
    if not (path / "config.yaml").exists():
        raise CheckpointError(f"{run_dir} has no config.yaml; is it an fdlit run directory?")
    if not (path / CHECKPOINT_NAME).exists():
        raise CheckpointError(f"{run_dir} has no {CHECKPOINT_NAME}: no round of that run completed, start it anew")
    parser, cfg = parse_fit(["--config", str(path / "config.yaml"), *overrides])
    loop = build_loop(cfg, parser)
    loop.resume_from = path
    return loop


def resume_hint(loop) -> str:
    path = Path(getattr(loop, "run_path", "") or "")
    if path and (path / CHECKPOINT_NAME).exists():
        return (f"the checkpoint of round {loop.round} is intact; continue with: "
                f"python -m fdlit fit --resume {path}")
    return "no round completed, so there is no checkpoint to resume from"
