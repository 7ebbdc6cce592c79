"""Checkpoints: a killed run continues from its last complete round.

``<run_dir>/checkpoint.pt`` is rewritten at the end of every round, atomically (write
``checkpoint.pt.tmp``, fsync, rename), so the previous checkpoint stays intact until the new one is
complete. It holds tensors and plain data only (dicts, lists, tuples, numbers, strings), and is
loaded with ``torch.load(weights_only=True)``: a file holding any other pickled object is refused,
so loading a checkpoint can never run code.

Contents: the loop's ``state_dict()`` (every client's weights, optimizer state, random generator
and method state; the method's server state and set-up broadcast; the round; the communication
ledger; the metrics history; wall time), the python, numpy, torch (and CUDA) random states, the W&B
run id, and a fingerprint of the config that produced it.

Resuming (``fdlit fit --resume <run_dir>``, :mod:`fdlit.runs.experiment`) rebuilds the loop from
``<run_dir>/config.yaml``, loads this file into it after set-up, rewrites ``metrics.jsonl`` /
``communication.jsonl`` from the checkpoint's history and ledger (rows written after the checkpoint
go, a damaged file is kept beside it), and continues with round ``round + 1``.
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
from fdlit.runs.directory import CHECKPOINT

if TYPE_CHECKING:  # pragma: no cover
    from fdlit.federation.loop import FederationLoop

FORMAT = "fdlit-checkpoint"
VERSION = 2  # 2: the loop's state_dict under "loop" (method server state and set-up broadcast included)
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
def checkpoint_state(loop: "FederationLoop", config: dict[str, Any], wandb_run_id: str | None = None) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "config_sha256": config_fingerprint(config),
        "loop": loop.state_dict(),
        "rng": rng_state(),
        "wandb_run_id": wandb_run_id,
    }


def save_checkpoint(state: dict[str, Any], path: Path) -> Path:
    """Write ``state`` to ``path`` atomically: a kill at any moment leaves either the old or the new
    checkpoint, never a torn one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # disk full, Ctrl-C: the previous checkpoint stays, and no half-written .tmp
        tmp.unlink(missing_ok=True)
        raise
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
        path = path / CHECKPOINT
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


def check_config(config: dict[str, Any], rounds: int, state: dict[str, Any]) -> None:
    """Refuse a checkpoint of another config, or one beyond ``rounds``; needs no set-up, so it runs
    before any work and before the run directory is touched."""
    if state["config_sha256"] != config_fingerprint(config):
        raise CheckpointError(
            "the checkpoint was written by a different config; only "
            f"{', '.join(RESUMABLE_CHANGES)} may change when resuming"
        )
    if state["loop"]["round"] > rounds:
        raise CheckpointError(f"checkpoint is at round {state['loop']['round']}, beyond federation.rounds = {rounds}")


def check_resumable(loop: "FederationLoop", config: dict[str, Any], state: dict[str, Any]) -> None:
    """Refuse a checkpoint that does not fit the loop, before anything is written."""
    check_config(config, loop.rounds, state)
    saved = state["loop"]
    if saved["num_clients"] != len(loop.clients):
        raise CheckpointError(f"checkpoint has {saved['num_clients']} clients, the config {len(loop.clients)}")


def restore_checkpoint(loop: "FederationLoop", state: dict[str, Any]) -> None:
    """Load ``state`` into a set-up loop (clients built, nothing trained); the random states last."""
    loop.load_state_dict(state["loop"])
    set_rng_state(state["rng"])  # last: nothing after this may draw random numbers before round r+1


class Checkpointer(FederationCallback):
    """Writes ``<run_dir>/checkpoint.pt`` at the end of every round. It must be the last callback,
    so the saved random state is the one the next round starts from. ``wandb_run_id`` is a callable
    giving the run's W&B id (or None)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], wandb_run_id=lambda: None, saved_round: int = 0):
        self.path = Path(run_dir) / CHECKPOINT
        self.config = config
        self.wandb_run_id = wandb_run_id
        self.saved_round = saved_round  # the round the checkpoint on disk holds (0: none yet)

    def on_round_end(self, loop, round, metrics):
        save_checkpoint(checkpoint_state(loop, self.config, self.wandb_run_id()), self.path)
        self.saved_round = round


def resume_hint(run_dir: Path | None, round: int) -> str:
    """How to continue a stopped run whose checkpoint holds ``round`` (0: none)."""
    if run_dir is not None and round > 0 and (Path(run_dir) / CHECKPOINT).exists():
        return (f"the checkpoint of round {round} is intact; continue with: "
                f"python -m fdlit fit --resume {run_dir}")
    return "no round completed, so there is no checkpoint to resume from; start the run again"
