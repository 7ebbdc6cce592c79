"""One experiment: the loop assembled from a parsed ``fit`` config, with its run directory, W&B run,
progress bar and checkpoints observing it; and the same experiment resumed from its run directory.

The loop itself knows nothing of files or trackers: everything here reaches it as a callback, and
a checkpoint is the loop's ``state_dict()``.
"""

from __future__ import annotations

import contextlib
import copy
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import ArgumentParser, Namespace

from fdlit.configuration.former_names import translated
from fdlit.configuration.schema import fit_parser, parse_fit
from fdlit.configuration.ranges import check_knob_ranges
from fdlit.data.hub import check_obtainable
from fdlit.federation import FederationLoop, NumericalFault, format_summary
from fdlit.federation.server import ServerModel
from fdlit.federation.settings import FederationSettings
from fdlit.runs.checkpoint import (
    CheckpointConfig, CheckpointError, Checkpointer, check_config, check_resumable, load_checkpoint, offer_kept,
    restore_checkpoint, resume_hint,
)
from fdlit.errors import ConfigError
from fdlit.runs.directory import (
    CHECKPOINT, CONFIG, LockNotAFile, RunDirectory, RunLock, check_run_name, check_run_parent, create_run_dir,
    kept_checkpoints, read_config, rebuild_logs, safe_name,
)
from fdlit.configuration.run_settings import LoggerConfig
from fdlit.runs.progress import ProgressBar
from fdlit.runs.wandb_logger import WandbLogger, check_credentials

# flags that may accompany --resume: more rounds, and how to log; everything else comes from the run
KEPT_CHECKPOINT = re.compile(r"checkpoint(-r\d+)?\.pt")
RESUME_FLAGS = ("--federation.rounds", "--federation.devices", "--logger.mode", "--logger.progress",
                "--checkpoint.every_n_rounds",
                "--checkpoint.keep", "--checkpoint.background")


def default_run_name(loop: FederationLoop, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The run's name when ``logger.name`` is null, and what the summary records of its setting: the
    name carries the non-default settings and a hash unique per setting (fdlit.runs.naming.run_name)."""
    from fdlit.runs.naming import run_name

    method = getattr(loop.server_side.method, "short_name", type(loop.server_side.method).__name__)
    method = {"fd": method, "local_only": "local", "reference": "reference"}[loop.settings.mode]
    d = loop.data
    heterogeneity = f"k{d.classes_per_client}" if d.partition == "classes" else f"dir{d.dirichlet_alpha}"
    name, digest, differs = run_name(config, safe_name(method), heterogeneity, loop.seed)  # a custom short_name may hold anything
    return name, {"setting": digest, "non_default_settings": differs}


def loop_from_config(cfg: Namespace, init: Namespace, server: bool = True) -> FederationLoop:
    """The federation of a parsed ``fit`` config (``init``: its instantiated sections); ``server``
    False leaves out the server model (a deployment's node builds the clients only)."""
    server_model = None
    if server:
        server_spec = cfg.server.model.as_dict() if cfg.server.model is not None else None
        server_model = ServerModel(**{k: v for k, v in vars(init.server).items() if k != "model"}, model=server_spec)
    return FederationLoop(FederationSettings(**vars(init.federation)), data=init.data, model=cfg.model.as_dict(), client=init.client,
                          aggregator=init.aggregator, privacy=init.privacy, seed=cfg.seed, server=server_model,
                          adversaries=init.adversaries)


class Experiment:
    """A ``fit`` config made into a run. ``resume_from``: a run directory to continue (from its
    checkpoint, or from round 1 in the same directory when no round completed there).

    Constructing it checks the whole config (constructors raise ConfigError) without any work;
    ``fit`` sets up, takes the run directory's lock and holds it until it returns or raises."""

    def __init__(self, cfg: Namespace, parser: Optional[ArgumentParser] = None, resume_from: Optional[Path] = None,
                 checkpoint_file: Optional[Path] = None, saved_values: Optional[dict[str, Any]] = None):
        parser = parser or fit_parser()
        init = parser.instantiate(cfg)  # constructors check their arguments: ConfigError before any work
        if resume_from is None:  # a run saved before the ranges were checked resumes as it ran
            check_knob_ranges("aggregator", cfg.aggregator)  # what the constructors accept but overflows float32
        check_obtainable(init.data.dataset, init.data.data_dir)  # offline and not cached: refused before any import
        self.config: dict[str, Any] = cfg.clone().as_dict()
        self.config.pop("config", None)
        self.config_yaml = parser.dump(cfg, skip_unset=False)  # keep null keys: the saved config is complete
        self.logger: LoggerConfig = init.logger
        check_credentials(self.logger)  # online without credentials: refused here, not an offline run later
        self.checkpoint: CheckpointConfig = init.checkpoint
        self.loop = loop_from_config(cfg, init)
        self.resume_from = Path(resume_from) if resume_from is not None else None
        # on resume: the checkpoint to continue from (default the run's checkpoint.pt; a kept one by name)
        self.checkpoint_file = Path(checkpoint_file) if checkpoint_file is not None else None
        if self.resume_from is None:  # a folder to create the run in, checked before any work
            check_run_parent("logger.run_dir", self.logger.run_dir)
        self.run_path: Optional[Path] = None
        self.lock: Optional[RunLock] = None
        self.checkpointer: Optional[Checkpointer] = None
        self.wandb: Optional[WandbLogger] = None  # set with the run directory
        self.progress_stream = None  # where the round lines go (None: stderr); a deployment's ServerApp: a file
        self.resumed_round = 0  # the round of the checkpoint a resume continues from (0: none)
        # the config the checkpoint was written with: this one, but for knobs reset on resume (legacy_noop_knobs)
        self.saved_config = with_values(self.config, saved_values or {})

    def note_own_modules(self) -> None:
        """One line per part of a user's LightningModule that the federation does not call."""
        from fdlit.clients.lightning_habits import own_module_notes

        clients = self.loop.parts.clients.clients
        own = next((c.own_module for c in clients if getattr(c, "own_module", None) is not None), None)
        for note in own_module_notes(own) if own is not None else []:
            print(f"fdlit: note: {note}", file=sys.stderr)

    def setup(self) -> None:
        """On resume: check the checkpoint against the config and take the run directory's lock
        (a second process stops here, before any work). Then build the clients, and only then, once
        nothing can fail on bad input, create the run directory (a new run) and the observers."""
        loop = self.loop
        user_callbacks = list(loop.callbacks)
        self.name, self.setting = default_run_name(loop, self.config)
        self.name = self.logger.name or self.name
        state = None
        if self.resume_from is not None:
            self.run_path = self.resume_from
            checkpoint = self.checkpoint_file or self.run_path / CHECKPOINT
            if checkpoint.exists():
                state = load_checkpoint(checkpoint)
                check_config(self.saved_config, loop.settings.rounds, state)
                self.resumed_round = state["loop"]["round"]
            try:
                self.lock = RunLock(self.run_path).acquire()
            except LockNotAFile as exc:  # the run itself is fine: say so, and how it continues
                raise CheckpointError(f"{exc.path} is {exc.what}, not fdlit's lock file (fdlit writes it as a plain "
                                      f"file); remove it; {resume_hint(self.run_path, self.resumed_round)}"
                                      ) from None
        loop.setup()
        self.note_own_modules()
        if self.resume_from is None:  # needs the data; still before any training or file (a saved run resumes as it ran)
            loop.settings.check_test_set(len(loop.parts.tensors.test_y))
        if state is not None:
            check_resumable(loop, self.saved_config, state)
        if self.resume_from is None:
            self.run_path = create_run_dir(Path(self.logger.run_dir), self.name)
            self.lock = RunLock(self.run_path).acquire()
        saved_round = state["loop"]["round"] if state is not None else 0
        if self.resume_from is not None:
            print(f"fdlit: resuming {self.run_path} after round {saved_round} of {loop.settings.rounds}" if state else
                  f"fdlit: starting {self.run_path} again from round 1 (no round completed there)", file=sys.stderr)
            if state is not None:
                restore_checkpoint(loop, state)  # sets the random state round r+1 starts from: nothing below draws
            for note in rebuild_logs(self.run_path, saved_round, loop.history, loop.server_side.ledger.rows()):
                print(f"fdlit: {note}", file=sys.stderr)
        wandb = self.wandb = WandbLogger(self.logger, self.config, self.run_path, self.name,
                                         run_id=state["wandb_run_id"] if state else None)
        self.identity = {"run": self.name, "run_dir": str(self.run_path), **self.setting}
        directory = RunDirectory(self.run_path, self.config_yaml, self.identity,
                                 messages_written=len(loop.server_side.ledger.messages))
        self.checkpointer = Checkpointer(self.run_path, self.config, wandb.current_run_id, self.checkpoint,
                                         saved_round=saved_round)
        loop.callbacks = [
            directory, wandb, *([ProgressBar(self.progress_stream)] if self.logger.progress else []), *user_callbacks,
            self.checkpointer,  # last: saves the random state the next round starts from
        ]

    @property
    def saved_round(self) -> int:
        """The round the run directory's checkpoint holds (0: none); before the checkpointer exists,
        that of the checkpoint being resumed."""
        return self.checkpointer.saved_round if self.checkpointer is not None else self.resumed_round

    def finish_checkpoint(self) -> str:
        """Wait for a checkpoint still being written in the background; '' or what went wrong."""
        if self.checkpointer is None:
            return ""
        try:
            self.checkpointer.wait()
        except Exception as write_error:
            return f"; writing the last checkpoint failed ({type(write_error).__name__}: {write_error})"
        return ""

    def stopped_hint(self) -> str:
        """What a stopped run left and how to continue it, in one line."""
        if self.run_path is None:
            return "the run had not started; nothing was written"
        failed = self.finish_checkpoint()
        return f"run directory {self.run_path}{failed}: {resume_hint(self.run_path, self.saved_round)}"

    def fit(self) -> dict[str, Any]:
        try:
            self.setup()
            return {**self.identity, **self.loop.fit()}
        finally:
            self.close()

    def close(self) -> None:
        """Release the run directory (also done when the process ends in any way), once the
        checkpoint being written in the background is on disk: the next holder must find it."""
        self.finish_checkpoint()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def run(self) -> dict[str, Any]:
        """``fit`` for the command line: print the summary; a numerical fault says how to resume."""
        try:
            summary = self.fit()
        except NumericalFault as exc:
            where = f"; metrics of earlier rounds are in {self.run_path}" if self.run_path else ""
            where += self.finish_checkpoint()
            raise NumericalFault(f"{exc}{where}\n{resume_hint(self.run_path, self.saved_round)}") from None
        print(format_summary(summary))
        if self.loop.stop_reason:  # the privacy budget ended the run early; the last round is checkpointed
            print(f"fdlit: stopped: {self.loop.stop_reason}; run directory {self.run_path}", file=sys.stderr)
        return summary


def resume_experiment(run_dir: str, overrides: list[str]) -> Experiment:
    """The experiment of ``run_dir``, rebuilt from its config.yaml with the same parser as ``fit``."""
    for arg in overrides:
        if arg.startswith("-") and arg.split("=", 1)[0] not in RESUME_FLAGS:
            raise CheckpointError(
                f"{arg.split('=', 1)[0]} cannot be changed when resuming (config and seed come from the run "
                f"directory); allowed with --resume: {', '.join(RESUME_FLAGS)}"
            )
    path, checkpoint = Path(run_dir), None
    if path.is_file() and KEPT_CHECKPOINT.fullmatch(path.name) and (path.parent / CONFIG).exists():
        path, checkpoint = path.parent, path  # --resume <run dir>/checkpoint-r<N>.pt: a kept checkpoint
    if not path.is_dir():
        raise CheckpointError(f"no run directory {run_dir!r}" + (" (that is a file)" if path.exists() else ""))
    if not (path / CONFIG).exists():
        raise CheckpointError(f"{run_dir} has no {CONFIG}; is it an fdlit run directory?")
    if checkpoint is None and not (path / CHECKPOINT).exists():
        if kept_checkpoints(path):  # checkpoint.pt deleted, earlier ones kept
            raise CheckpointError(f"{run_dir} has no {CHECKPOINT}; {offer_kept(path / CHECKPOINT)}")
        raise CheckpointError(f"{run_dir} has no {CHECKPOINT}: no round of that run completed, start it anew")
    saved = legacy_noop_knobs(path)
    for field, value in saved.items():
        print(f"fdlit: the run's {field} {value!r} does nothing in its settings (refused for new runs); it "
              f"continues with {NOOP_DEFAULTS[field]!r}, the same run", file=sys.stderr)
    reset = [f"--{field}={str(NOOP_DEFAULTS[field]).lower()}" for field in saved]
    with current_names(path) as config:
        parser, cfg = parse_fit(["--config", str(config), *legacy_name(path), *reset, *overrides])
        return Experiment(cfg, parser, resume_from=path, checkpoint_file=checkpoint, saved_values=saved)


@contextlib.contextmanager
def current_names(path: Path, say: bool = True):
    """The run's config file, or where it names a class by a former name (saved before the methods'
    renames), a copy in current names (the run goes on as the same run; its checkpoint is checked
    against the config as saved, and the config it writes next names the classes as they are now).
    ``say``: one line per renamed class."""
    try:
        config, changed = translated(read_config(path))
    except (OSError, yaml.YAMLError, ConfigError):  # an unreadable config.yaml: parse_fit says what is wrong
        changed = {}
    if not changed:
        yield path / CONFIG
        return
    for key, (old, new) in changed.items() if say else ():
        print(f"fdlit: the run's {key} {old} was renamed; it continues as {new}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="fdlit-resume-") as folder:
        copy_path = Path(folder) / CONFIG
        copy_path.write_text(yaml.safe_dump(config, sort_keys=False))
        yield copy_path


# knobs that do nothing in some settings, refused there since; the value that does the same
NOOP_DEFAULTS = {"privacy.top_k": 1, "privacy.bits": 8, "server.broadcast": False}


def legacy_noop_knobs(path: Path) -> dict[str, Any]:
    """{field: value} of the knobs ``path``'s saved config sets although they do nothing there
    (privacy.top_k or privacy.bits of another encoding, server.broadcast without a server model):
    saved before such settings were refused, the run resumes with :data:`NOOP_DEFAULTS` instead,
    which is the same run, and its checkpoint is checked against the config as saved."""
    try:
        config = read_config(path)
    except (OSError, yaml.YAMLError, ConfigError):  # an unreadable config.yaml: parse_fit says what is wrong
        return {}
    privacy, server = config.get("privacy"), config.get("server")
    found = {}
    if isinstance(privacy, dict):
        encoding = privacy.get("encoding", "full")
        if privacy.get("top_k", 1) != 1 and encoding != "top_k":
            found["privacy.top_k"] = privacy["top_k"]
        if privacy.get("bits", 8) != 8 and encoding != "quantised":
            found["privacy.bits"] = privacy["bits"]
    if isinstance(server, dict) and server.get("broadcast") is True and server.get("model") is None:
        found["server.broadcast"] = True
    return found


def with_values(config: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with the dotted ``values`` set."""
    if not values:
        return config
    out = copy.deepcopy(config)
    for field, value in values.items():
        *sections, key = field.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return out


def legacy_name(path: Path) -> list[str]:
    """A run saved with a name that is not folder-safe (allowed before names were checked) resumes
    under the safe form of it: the name is not part of the config's fingerprint."""
    try:
        name = (read_config(path).get("logger") or {}).get("name")
        if name is not None:
            check_run_name("logger.name", name)
    except ConfigError:
        print(f"fdlit: the run's name {name!r} is not one folder name; it continues as {safe_name(name)!r}",
              file=sys.stderr)
        return [f"--logger.name={safe_name(name)}"]
    except (OSError, yaml.YAMLError, AttributeError):  # an unreadable config.yaml: parse_fit says what is wrong
        pass
    return []
