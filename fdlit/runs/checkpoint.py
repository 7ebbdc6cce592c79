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

The state is assembled at the end of the round (a snapshot: packed tensors are copies, on the CPU), then written
by a background thread while the next round runs (``checkpoint.background``); the next checkpoint, the end of
the run and a numerical fault wait for it.

Resuming (``fdlit fit --resume <run_dir>``, :mod:`fdlit.runs.experiment`) rebuilds the loop from ``<run_dir>/config.yaml``,
loads this file into it after set-up, rewrites ``metrics.jsonl`` / ``communication.jsonl`` from the checkpoint's
history and ledger (rows written after the checkpoint go, a damaged file is kept beside it), and continues with
round ``round + 1``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fdlit.callbacks import FederationCallback, RoundView
from fdlit.configuration.former_names import former_configs
from fdlit.errors import ConfigError, check_at_least
from fdlit.privacy.upload import default_config
from fdlit.configuration.run_settings import CheckpointConfig  # noqa: F401  (the checkpoint section, importable from here)
from fdlit.runs.atomic_write import storage_error, write_file
from fdlit.runs.checkpoint_contents import (  # noqa: F401  (the checkpoint's names, importable from here)
    _detached,
    content_digest,
    pack_client_states,
    rng_state,
    set_rng_state,
    unpack_client_states,
)
from fdlit.runs.directory import (
    CHECKPOINT, METRICS, RunFileError, check_run_file, kept_checkpoints, read_jsonl, round_checkpoint,
)

if TYPE_CHECKING:  # pragma: no cover
    from fdlit.federation.loop import FederationLoop

FORMAT = "fdlit-checkpoint"
VERSION = 4  # 4: a content checksum; 3: client states packed; 2: a list of per-client states (still read)
READABLE_VERSIONS = (2, 3, 4)
CHECKSUMMED_VERSION = 4
# config keys that may differ between the run that wrote a checkpoint and the run resuming it
RESUMABLE_CHANGES = ("federation.rounds", "logger", "checkpoint")


class CheckpointError(ConfigError):
    """A checkpoint or run directory cannot be resumed (or exported: ``field``); the message says why."""

    def __init__(self, message: str, field: str = "resume"):
        super().__init__(field, message)


# what a damaged checkpoint's line offers, per command: the kept checkpoint to use instead, or what is left to do
RESUME_OFFER = ("continue from it with: python -m fdlit fit --resume {kept}", "start the run again")


def write_failure(path: Path, cause: BaseException) -> OSError:
    """Writing a checkpoint failed for a reason torch reports as a RuntimeError (its zip writer's
    ``unexpected pos`` or ``file write failed``): an OSError like the others, so it ends the command
    in one line. The system's error that made torch fail (disk full, the file size limit) is the
    RuntimeError's context when torch wrote through fdlit's file, and is the one named; without it,
    a nearly full disk is taken to be the reason, else an input/output error with torch's words."""
    seen, error = set(), cause
    while error is not None and id(error) not in seen:  # the chain of errors torch's error came from
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno:  # disk full, file size limit, read-only, I/O error
            return storage_error(error.errno, path)
        error = error.__cause__ or error.__context__
    try:
        full = shutil.disk_usage(Path(path).parent).free < 2**20
    except OSError:
        full = False
    if full:
        return storage_error(errno.ENOSPC, path)
    return CheckpointWriteError(path, cause)


class CheckpointWriteError(OSError):
    """A checkpoint write that failed without a system error to name (torch's words kept)."""

    def __init__(self, path: Path, cause: BaseException):
        detail = " ".join(str(cause).split())[:160]
        super().__init__(errno.EIO, f"{os.strerror(errno.EIO)} (writing the checkpoint failed: {detail})", str(path))


# ---------------------------------------------------------------------------------- fingerprints
# knobs added after runs were saved (a method's by class name), each at the value that changes nothing
LATER_PRIVACY_KNOBS = {"accounting": "local", "secure_aggregation": None, "secure_threshold": 0.5, "upload_audit": False}
LATER_METHOD_KNOBS = {"COMET": {"regularization_weight": 1.0}}


def without_noop_sections(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a resolved config without the sections and knobs whose values change nothing (no
    server model, no attack, no privacy mechanism, the default threat model), so that a run saved
    before one of them existed is the same experiment as one saved after."""
    cfg = json.loads(json.dumps(config, default=str))
    if isinstance(cfg.get("server"), dict) and cfg["server"].get("model") is None:
        cfg.pop("server")
    if isinstance(cfg.get("adversaries"), dict) and cfg["adversaries"].get("attack") is None:
        cfg.pop("adversaries")
    if isinstance(cfg.get("privacy"), dict):  # knobs added later, at the value that changes nothing
        for knob, value in LATER_PRIVACY_KNOBS.items():
            if cfg["privacy"].get(knob, value) == value:
                cfg["privacy"].pop(knob, None)
    if cfg.get("privacy") == {k: v for k, v in default_config().items() if k not in LATER_PRIVACY_KNOBS}:
        cfg.pop("privacy")
    federation = cfg.get("federation")
    if isinstance(federation, dict):  # CUDA-graph knobs added later, at the value that changes nothing
        # no CUDA graphs, no virtual clock, both evaluations: what runs did before these knobs
        for knob, value in (("cuda_graphs", False), ("clock", None), ("eval_after_private", True)):
            if knob in federation and federation[knob] == value:
                federation.pop(knob)
        executor = federation.get("executor")
        init = executor.get("init_args") if isinstance(executor, dict) else None
        if isinstance(init, dict) and init.get("graph_optimizer") is True:
            init.pop("graph_optimizer")
    method = cfg.get("aggregator") if isinstance(cfg.get("aggregator"), dict) else {}
    for knob, value in LATER_METHOD_KNOBS.get(str(method.get("class_path")).rsplit(".", 1)[-1], {}).items():
        if isinstance(method.get("init_args"), dict) and method["init_args"].get(knob, value) == value:
            method["init_args"].pop(knob, None)  # a method's knob added later, at its no-op value
    if isinstance(cfg.get("client"), dict) and cfg["client"].get("optimizer_scope") == "shared":
        cfg["client"].pop("optimizer_scope")  # one optimizer across phases and rounds: what runs did before the knob
    if isinstance(cfg.get("data"), dict) and cfg["data"].get("input_scaling", "absent") is None:
        cfg["data"].pop("input_scaling")  # null: the dataset's own scaling, what runs did before the knob
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


# ---------------------------------------------------------------------------------- save / load
def checkpoint_state(run: RoundView, config: dict[str, Any], wandb_run_id: str | None = None) -> dict[str, Any]:
    """The checkpoint of ``run`` (the loop, or the view its callbacks get) as it is now: a snapshot
    (copies), safe to write while the next round trains. History rows and the ledger's columns are
    never changed once written, so they are taken as they are."""
    state = run.state_dict()
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
    state = {**state, "sha256": content_digest(state)}
    try:
        write_file(path, lambda f: torch.save(state, f), field="checkpoint", run_dir=path.parent, sync_folder=True)
    except RuntimeError as exc:  # torch's zip writer reports ENOSPC, EIO, EFBIG like this
        raise write_failure(path, exc) from None
    return path


def load_checkpoint(path: Path, field: str = "resume", offer: tuple[str, str] = RESUME_OFFER) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True`` and verify its checksum; refuse pickled
    objects, foreign files and damaged ones (naming the newest intact kept checkpoint, and what to do
    with it: ``offer``), as a CheckpointError for ``field``."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path} (no round of that run completed?)", field)
    state = read_verified(path)
    if isinstance(state, str):
        raise CheckpointError(f"{state}; {offer_kept(path, offer)}", field)
    if isinstance(state["loop"]["clients"], dict):  # versions 3 and 4: packed
        state["loop"]["clients"] = unpack_client_states(state["loop"]["clients"])
    return state


def read_verified(path: Path) -> dict[str, Any] | str:
    """The checkpoint at ``path`` (client states still packed) if it is an intact fdlit checkpoint,
    else one sentence saying what is wrong with it."""
    try:
        check_run_file(path)  # a regular file of its run folder: never a device or a link out of it
    except RunFileError as exc:
        return str(exc).split(": ", 1)[1]
    except OSError:
        pass  # torch.load says what is wrong with it
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


def offer_kept(damaged: Path, offer: tuple[str, str] = RESUME_OFFER) -> str:
    """The newest intact kept checkpoint (``checkpoint.keep``) other than ``damaged`` in its run
    directory, with the command that uses it (``offer[0]``); or why there is none and what to do (``offer[1]``)."""
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
            return f"the newest intact checkpoint kept is round {round}'s; " + offer[0].format(kept=kept)
    return f"no intact earlier checkpoint is kept (checkpoint.keep); {offer[1]}"


def check_config(config: dict[str, Any], rounds: int, state: dict[str, Any]) -> None:
    """Refuse a checkpoint of another config, or one beyond ``rounds``; needs no set-up, so it runs
    before any work and before the run directory is touched."""
    # a run saved before the methods' renames: its checkpoint fingerprints the config in former names
    if state["config_sha256"] not in (config_fingerprint(c) for c in (config, *former_configs(config))):
        raise CheckpointError(
            "the checkpoint was written by a different config; only "
            f"{', '.join(RESUMABLE_CHANGES)} may change when resuming"
        )
    if state["loop"]["round"] > rounds:
        raise CheckpointError(f"checkpoint is at round {state['loop']['round']}, beyond federation.rounds = {rounds}")


def check_resumable(loop: FederationLoop, config: dict[str, Any], state: dict[str, Any]) -> None:
    """Refuse a checkpoint that does not fit the loop, before anything is written."""
    check_config(config, loop.settings.rounds, state)
    saved = state["loop"]
    if saved["num_clients"] != len(loop.parts.clients):
        raise CheckpointError(f"checkpoint has {saved['num_clients']} clients, the config {len(loop.parts.clients)}")


def restore_checkpoint(loop: FederationLoop, state: dict[str, Any]) -> None:
    """Load ``state`` into a set-up loop (clients built, nothing trained); the random states last."""
    loop.load_state_dict(state["loop"])
    set_rng_state(state["rng"])  # last: nothing after this may draw random numbers before round r+1


class Checkpointer(FederationCallback):
    """Writes ``<run_dir>/checkpoint.pt`` at the end of the rounds ``settings`` says (default: every
    round). It must be the last callback, so the saved random state is the one the next round
    starts from. ``wandb_run_id`` is a callable giving the run's W&B id (or None);
    ``saved_round``: the round of the checkpoint already in ``run_dir`` (a resumed run)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], wandb_run_id: Callable[[], str | None] = lambda: None,
                 settings: CheckpointConfig | None = None, saved_round: int = 0):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / CHECKPOINT
        self.config = config
        self.wandb_run_id = wandb_run_id
        self.settings = settings or CheckpointConfig()
        self.saved_round = saved_round  # the newest round whose checkpoint is complete on disk (0: none)
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None

    def due(self, view: RoundView, round: int) -> bool:
        return round % self.settings.every_n_rounds == 0 or round >= view.rounds

    def on_round_end(self, view: RoundView, round, metrics):
        if not self.due(view, round):
            return
        self.wait()  # one write at a time, and at most one snapshot in memory besides the live state
        state = checkpoint_state(view, self.config, self.wandb_run_id())
        if self.settings.background:
            self._writer = threading.Thread(target=self._write, args=(state, round), name="fdlit-checkpoint")
            self._writer.start()
        else:
            self._write(state, round)
            self._raise()

    def on_fit_end(self, view: RoundView, summary):
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
        except OSError:  # no hard links here: a copy, written as every file is
            with open(self.path, "rb") as source:
                write_file(target, lambda f: shutil.copyfileobj(source, f), field="checkpoint", run_dir=self.run_dir)
        else:
            os.replace(tmp, target)
        for old in kept_checkpoints(self.run_dir)[: -self.settings.keep]:
            old[1].unlink(missing_ok=True)


def resume_hint(run_dir: Path | None, round: int) -> str:
    """How to continue a stopped run whose checkpoint holds ``round`` (0: none). The checkpoint is
    read back and its checksum verified before it is called intact."""
    path = Path(run_dir) / CHECKPOINT if run_dir is not None else None
    if path is None or round <= 0 or not path.exists():
        done = completed_rounds(run_dir) if run_dir is not None else 0
        if done:  # rounds ran, but their checkpoint could not be written
            rounds = "round 1" if done == 1 else f"rounds 1 to {done}"
            return (f"{rounds} completed ({METRICS} holds them) but no checkpoint was written, so there is nothing "
                    "to resume from; start the run again")
        return "no round completed, so there is no checkpoint to resume from; start the run again"
    state = read_verified(path)
    if isinstance(state, str):
        return f"{state}; {offer_kept(path)}"
    return (f"the checkpoint of round {state['loop']['round']} is intact; continue with: "
            f"python -m fdlit fit --resume {run_dir}")


def completed_rounds(run_dir: Path) -> int:
    """The last round ``run_dir``'s metrics.jsonl records (0: none, or a file fdlit cannot read)."""
    try:
        rounds = [row.get("round") for row in read_jsonl(Path(run_dir) / METRICS)]
    except (OSError, ConfigError):
        return 0
    return max((r for r in rounds if isinstance(r, int) and not isinstance(r, bool)), default=0)
