"""Checkpoints: a killed run continues from its last checkpointed round.

``<run_dir>/checkpoint.pt`` is rewritten at the end of every ``checkpoint.every_n_rounds``-th round
and of the run's last round, atomically (write ``checkpoint.pt.tmp``, fsync, rename), so the
previous checkpoint stays intact until the new one is complete. ``checkpoint.keep`` also keeps the
checkpoints of the last few saved rounds as ``checkpoint-r<N>.pt``. It holds tensors and plain data
only (dicts, lists, tuples, numbers, strings), and is loaded with ``torch.load(weights_only=True)``:
a file holding any other pickled object is refused, so loading a checkpoint can never run code.

Integrity: every file carries the sha256 of its contents (``sha256``: every tensor's bytes, dtype
and shape, and every plain value, in order), computed by the writer and verified by
:func:`load_checkpoint`; a file whose contents changed on disk (a flipped byte, a bad sector) is
refused, naming it and the newest intact checkpoint kept by ``checkpoint.keep``. Files written
before the checksum existed (versions 2 and 3) are read unverified.

Contents: the loop's ``state_dict()`` (every client's weights, optimizer state, random generator
and method state; the method's server state and set-up broadcast; the round; the communication
ledger; the metrics history; wall time), the python, numpy, torch (and CUDA) random states, the W&B
run id, and a fingerprint of the config that produced it.

Client states are stored packed (:func:`pack_client_states`): per group of clients with the same
state structure, one stacked tensor per state tensor, so a file of M clients holds a few dozen large
tensors instead of ~25 M small ones (``torch.save`` pays per tensor: at 500 digits clients, 1.0 s for
the per-client list against 0.2 s packed). :func:`load_checkpoint` unpacks them, so a loaded state
is the loop's ``state_dict()`` again, bit for bit.

The state is assembled at the end of the round (a snapshot: packed tensors are copies, on the CPU),
then written by a background thread while the next round runs (``checkpoint.background``); the
next checkpoint, the end of the run and a numerical fault wait for it.

Resuming (``fdlit fit --resume <run_dir>``, :mod:`fdlit.runs.experiment`) rebuilds the loop from
``<run_dir>/config.yaml``, loads this file into it after set-up, rewrites ``metrics.jsonl`` /
``communication.jsonl`` from the checkpoint's history and ledger (rows written after the checkpoint
go, a damaged file is kept beside it), and continues with round ``round + 1``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch

from fdlit.callbacks import FederationCallback
from fdlit.errors import ConfigError, check_at_least
from fdlit.privacy.upload import default_config
from fdlit.runs.directory import CHECKPOINT, kept_checkpoints, round_checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from fdlit.federation.loop import FederationLoop

FORMAT = "fdlit-checkpoint"
VERSION = 4  # 4: a content checksum; 3: client states packed; 2: a list of per-client states (still read)
READABLE_VERSIONS = (2, 3, 4)
CHECKSUMMED_VERSION = 4
# config keys that may differ between the run that wrote a checkpoint and the run resuming it
RESUMABLE_CHANGES = ("federation.rounds", "logger", "checkpoint")


class CheckpointError(ConfigError):
    """A checkpoint or run directory cannot be resumed; the message says why."""

    def __init__(self, message: str):
        super().__init__("resume", message)


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed for a reason torch reports as a RuntimeError (its zip writer's
    ``file write failed``): an OSError like the others, so it ends the command in one line."""

    def __init__(self, path: Path, cause: BaseException):
        try:
            full = shutil.disk_usage(Path(path).parent).free < 2**20
        except OSError:
            full = False
        code = errno.ENOSPC if full else errno.EIO
        detail = " ".join(str(cause).split())[:160]
        super().__init__(code, f"{os.strerror(code)} (writing the checkpoint failed: {detail})", str(path))


# ---------------------------------------------------------------------------------- checksum
def content_digest(state: Any) -> str:
    """sha256 of a checkpoint's contents: every tensor's dtype, shape and bytes and every plain
    value, in order; the same for the state written and the state read back."""
    h = hashlib.sha256()
    _digest(state, h)
    return h.hexdigest()


def _digest(obj: Any, h: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}".encode())
        h.update(t.view(torch.uint8).numpy())  # hashlib reads the buffer: no copy
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k, v in obj.items():
            _digest(k, h)
            _digest(v, h)
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _digest(v, h)
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        h.update(f"S{len(data)}:".encode() + data)
    else:  # numbers, None, booleans, dtypes
        text = repr(obj).encode()
        h.update(f"V{type(obj).__name__}{len(text)}:".encode() + text)


# ---------------------------------------------------------------------------------- fingerprints
def without_noop_sections(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a resolved config without the sections and knobs whose values change nothing (no
    server model, no attack, no privacy mechanism, the default threat model), so that a run saved
    before one of them existed is the same experiment as one saved after."""
    cfg = json.loads(json.dumps(config, default=str))
    if isinstance(cfg.get("server"), dict) and cfg["server"].get("model") is None:
        cfg.pop("server")
    if isinstance(cfg.get("adversaries"), dict) and cfg["adversaries"].get("attack") is None:
        cfg.pop("adversaries")
    if cfg.get("privacy") == default_config():
        cfg.pop("privacy")
    elif isinstance(cfg.get("privacy"), dict) and cfg["privacy"].get("accounting") == "local":
        cfg["privacy"].pop("accounting")
    return cfg


def config_fingerprint(config: dict[str, Any]) -> str:
    """sha256 of the resolved config without its no-op sections (``without_noop_sections``) and the
    keys a resume may change (rounds, the GPU, logger, checkpoint)."""
    cfg = without_noop_sections(config)
    cfg.pop("logger", None)
    cfg.pop("checkpoint", None)
    cfg.pop("config", None)
    if isinstance(cfg.get("federation"), dict):
        cfg["federation"].pop("rounds", None)
        cfg["federation"].pop("devices", None)  # which GPU: a resumed run may continue on another one
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


# ---------------------------------------------------------------------------------- packed client states
def _split(obj: Any, path: tuple, paths: list, tensors: list) -> Any:
    """``obj`` with every tensor replaced by None (the skeleton); tensors and their paths appended."""
    if isinstance(obj, torch.Tensor):
        paths.append(path)
        tensors.append(obj)
        return None
    if isinstance(obj, dict):
        out = type(obj)((k, _split(v, path + (k,), paths, tensors)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # module versions in a state_dict (load_state_dict reads them)
            out._metadata = obj._metadata
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, path + (i,), paths, tensors) for i, v in enumerate(obj))
    return obj


def _fill(skeleton: Any, path: tuple, at: dict, tensors: list) -> Any:
    """The inverse of :func:`_split`: the skeleton with ``tensors[at[path]]`` put back."""
    if path in at:
        return tensors[at[path]]
    if isinstance(skeleton, dict):
        out = type(skeleton)((k, _fill(v, path + (k,), at, tensors)) for k, v in skeleton.items())
        if hasattr(skeleton, "_metadata"):
            out._metadata = skeleton._metadata
        return out
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_fill(v, path + (i,), at, tensors) for i, v in enumerate(skeleton))
    return skeleton


def pack_client_states(states: list[dict]) -> dict:
    """Client states as a few large CPU tensors (a copy: later training does not change it).

    Clients whose states have the same structure (keys, plain values, tensor shapes, dtypes and
    devices) form a group, and each state tensor is stacked across the group's clients. A
    homogeneous federation is one group: one tensor per weight, Adam moment, step count and
    generator state, however many clients. Clients that differ (another architecture, an optimizer
    that has not stepped yet, a method state of another shape) get their own groups; a client that
    matches no other is a group of one, i.e. stored per client."""
    groups: list[dict] = []
    by_key: dict[tuple, dict] = {}
    for i, state in enumerate(states):
        paths: list = []
        tensors: list = []
        skeleton = _split(state, (), paths, tensors)
        key = (repr(skeleton), tuple((p, tuple(t.shape), t.dtype, t.device) for p, t in zip(paths, tensors)))
        group = by_key.get(key)
        if group is None:
            group = by_key[key] = {"clients": [], "skeleton": skeleton, "paths": paths, "members": []}
            groups.append(group)
        group["clients"].append(i)
        group["members"].append(tensors)
    packed = []
    for g in groups:
        stacked = [_stack_on_cpu([m[k].detach() for m in g["members"]]) for k in range(len(g["paths"]))]
        packed.append({"clients": g["clients"], "skeleton": g["skeleton"], "paths": g["paths"], "tensors": stacked})
    return {"num_clients": len(states), "groups": packed}


def _stack_on_cpu(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack on the CPU. Device tensors are copied into the CPU stack one by one, so packing
    never holds a second copy of every client's state in device memory."""
    if tensors[0].device.type == "cpu":
        return torch.stack(tensors)
    out = torch.empty((len(tensors), *tensors[0].shape), dtype=tensors[0].dtype)
    for row, t in zip(out, tensors):
        row.copy_(t)
    return out


def unpack_client_states(packed: dict) -> list[dict]:
    """The per-client states :func:`pack_client_states` was given, equal tensor for tensor; every
    client's tensors are its own (clones, not views of the stacked ones)."""
    states: list[Any] = [None] * packed["num_clients"]
    for g in packed["groups"]:
        at = {tuple(p): k for k, p in enumerate(g["paths"])}
        for j, client in enumerate(g["clients"]):
            tensors = [t[j].clone() for t in g["tensors"]]
            states[client] = _fill(g["skeleton"], (), at, tensors)
    return states


def _detached(obj: Any) -> Any:
    """Tensors cloned (to the CPU), containers copied: a snapshot training cannot change."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _detached(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_detached(v) for v in obj)
    return obj


# ---------------------------------------------------------------------------------- save / load
def checkpoint_state(loop: "FederationLoop", config: dict[str, Any], wandb_run_id: str | None = None) -> dict[str, Any]:
    """The checkpoint of ``loop`` as it is now: a snapshot (copies), safe to write while the next
    round trains. History rows and the ledger's columns are never changed once written, so they
    are taken as they are."""
    state = loop.state_dict()
    state["clients"] = pack_client_states(state["clients"])
    state["method"] = _detached(state["method"])
    state["received"] = _detached(state["received"])
    state["server"] = _detached(state.get("server"))
    return {
        "format": FORMAT,
        "version": VERSION,
        "config_sha256": config_fingerprint(config),
        "loop": state,
        "rng": rng_state(),
        "wandb_run_id": wandb_run_id,
    }


def save_checkpoint(state: dict[str, Any], path: Path) -> Path:
    """Write ``state`` with its checksum to ``path`` atomically: a kill at any moment leaves either
    the old or the new checkpoint, never a torn one. A failed write is an OSError."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    state = {**state, "sha256": content_digest(state)}
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # disk full, Ctrl-C: the previous checkpoint stays, and no half-written .tmp
        tmp.unlink(missing_ok=True)
        if isinstance(exc, RuntimeError):  # torch's zip writer reports ENOSPC, EIO, EFBIG like this
            raise CheckpointWriteError(path, exc) from None
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
    """Read a checkpoint with ``weights_only=True`` and verify its checksum; refuse pickled
    objects, foreign files and damaged ones (naming the newest intact kept checkpoint)."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path} (no round of that run completed?)")
    state = read_verified(path)
    if isinstance(state, str):
        raise CheckpointError(f"{state}; {offer_kept(path)}")
    if isinstance(state["loop"]["clients"], dict):  # versions 3 and 4: packed
        state["loop"]["clients"] = unpack_client_states(state["loop"]["clients"])
    return state


def read_verified(path: Path) -> dict[str, Any] | str:
    """The checkpoint at ``path`` (client states still packed) if it is an intact fdlit checkpoint,
    else one sentence saying what is wrong with it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = next((ln.strip() for ln in str(exc).splitlines() if "GLOBAL" in ln), str(exc).splitlines()[0])
        return f"refusing to load {path}: it contains a pickled object, not only tensors and plain data ({detail})"
    except Exception as exc:  # truncated, damaged, not a torch file, ...
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        return f"{path} is not a readable fdlit checkpoint ({detail})"
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return f"{path} is not an fdlit checkpoint (no format marker {FORMAT!r})"
    if state.get("version") not in READABLE_VERSIONS:
        return (f"{path} has checkpoint version {state.get('version')}; this fdlit reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}")
    if state["version"] >= CHECKSUMMED_VERSION:
        written = state.pop("sha256", None)
        try:
            found = content_digest(state)
        except Exception:  # a structure no writer makes
            found = None
        if written != found:
            return f"{path} is damaged: its contents do not match the checksum written with it"
    if not isinstance(state.get("loop"), dict) or not {"round", "clients"} <= state["loop"].keys():
        return f"{path} is not a readable fdlit checkpoint (no loop state)"
    return state


def offer_kept(damaged: Path) -> str:
    """The newest intact kept checkpoint (``checkpoint.keep``) other than ``damaged`` in its run
    directory, as the command that resumes from it; or why there is none."""
    damaged = Path(damaged)
    run_dir = damaged.parent
    try:
        damaged_inode = damaged.stat().st_ino  # a kept file may be a hard link of the damaged one
    except OSError:
        damaged_inode = None
    for round, kept in reversed(kept_checkpoints(run_dir)):
        if kept == damaged or kept.stat().st_ino == damaged_inode:
            continue
        if not isinstance(read_verified(kept), str):
            return f"the newest intact checkpoint kept is round {round}'s; continue from it with: " \
                   f"python -m fdlit fit --resume {kept}"
    return "no intact earlier checkpoint is kept (checkpoint.keep); start the run again"


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


class CheckpointConfig:
    """When the run directory's checkpoint is written (the ``checkpoint`` section; may change on resume).

    Args:
        every_n_rounds: write ``checkpoint.pt`` after every n-th round; the run's last round is
            always written. A killed run resumes from the last written round and repeats the rest.
        keep: also keep the checkpoints of the last ``keep`` written rounds as ``checkpoint-r<N>.pt``
            (hard links to the file just written where the filesystem allows, else copies); 0
            keeps only ``checkpoint.pt``.
        background: write the file in a background thread while the next round runs (the state is
            copied at the end of the round first, so what is written is that round's state).
    """

    def __init__(self, every_n_rounds: int = 1, keep: int = 0, background: bool = True):
        check_at_least("checkpoint.every_n_rounds", every_n_rounds, 1)
        check_at_least("checkpoint.keep", keep, 0)
        self.every_n_rounds = every_n_rounds
        self.keep = keep
        self.background = background


class Checkpointer(FederationCallback):
    """Writes ``<run_dir>/checkpoint.pt`` at the end of the rounds ``settings`` says (default: every
    round). It must be the last callback, so the saved random state is the one the next round
    starts from. ``wandb_run_id`` is a callable giving the run's W&B id (or None);
    ``saved_round``: the round of the checkpoint already in ``run_dir`` (a resumed run)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], wandb_run_id: Callable[[], Optional[str]] = lambda: None,
                 settings: Optional[CheckpointConfig] = None, saved_round: int = 0):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / CHECKPOINT
        self.config = config
        self.wandb_run_id = wandb_run_id
        self.settings = settings or CheckpointConfig()
        self.saved_round = saved_round  # the newest round whose checkpoint is complete on disk (0: none)
        self._writer: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def due(self, loop, round: int) -> bool:
        return round % self.settings.every_n_rounds == 0 or round >= loop.rounds

    def on_round_end(self, loop, round, metrics):
        if not self.due(loop, round):
            return
        self.wait()  # one write at a time, and at most one snapshot in memory besides the live state
        state = checkpoint_state(loop, self.config, self.wandb_run_id())
        if self.settings.background:
            self._writer = threading.Thread(target=self._write, args=(state, round), name="fdlit-checkpoint")
            self._writer.start()
        else:
            self._write(state, round)
            self._raise()

    def on_fit_end(self, loop, summary):
        self.wait()

    def wait(self) -> None:
        """Block until the checkpoint being written is on disk; raise if writing it failed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _write(self, state: dict[str, Any], round: int) -> None:
        try:
            save_checkpoint(state, self.path)
            self.saved_round = round
            if self.settings.keep:
                self._keep(round)
        except BaseException as exc:  # raised in the training thread by wait()
            self._error = exc

    def _keep(self, round: int) -> None:
        target = self.run_dir / round_checkpoint(round)
        tmp = target.with_name(target.name + ".tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(self.path, tmp)  # the file just written: no second write
        except OSError:
            import shutil

            shutil.copyfile(self.path, tmp)
        os.replace(tmp, target)
        for old in kept_checkpoints(self.run_dir)[: -self.settings.keep]:
            old[1].unlink(missing_ok=True)


def resume_hint(run_dir: Path | None, round: int) -> str:
    """How to continue a stopped run whose checkpoint holds ``round`` (0: none). The checkpoint is
    read back and its checksum verified before it is called intact."""
    path = Path(run_dir) / CHECKPOINT if run_dir is not None else None
    if path is None or round <= 0 or not path.exists():
        return "no round completed, so there is no checkpoint to resume from; start the run again"
    state = read_verified(path)
    if isinstance(state, str):
        return f"{state}; {offer_kept(path)}"
    return (f"the checkpoint of round {state['loop']['round']} is intact; continue with: "
            f"python -m fdlit fit --resume {run_dir}")
