"""One experiment: the loop assembled from a parsed ``fit`` config, with its run directory, W&B run,
progress bar and checkpoints observing it; and the same experiment resumed from its run directory.

The loop itself knows nothing of files or trackers: everything here reaches it as a callback, and
a checkpoint is the loop's ``state_dict()``.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from jsonargparse import ArgumentParser, Namespace

from fdlit.config import fit_parser, parse_fit
from fdlit.federation import FederationLoop, NumericalFault, format_summary
from fdlit.runs.checkpoint import (
    CheckpointConfig, CheckpointError, Checkpointer, check_resumable, load_checkpoint, restore_checkpoint, resume_hint,
)
from fdlit.runs.directory import CHECKPOINT, CONFIG, RunDirectory, truncate_to_round
from fdlit.runs.logger_config import LoggerConfig
from fdlit.runs.progress import ProgressBar
from fdlit.runs.wandb_logger import WandbLogger

# flags that may accompany --resume: more rounds, and how to log; everything else comes from the run
RESUME_FLAGS = ("--federation.rounds", "--logger.mode", "--logger.progress", "--checkpoint.every_n_rounds",
                "--checkpoint.keep", "--checkpoint.background")


def default_run_name(loop: FederationLoop) -> str:
    method = getattr(loop.aggregator, "short_name", type(loop.aggregator).__name__)
    method = {"fd": method, "local_only": "local", "reference": "reference"}[loop.mode]
    d = loop.data
    heterogeneity = f"k{d.classes_per_client}" if d.partition == "classes" else f"dir{d.dirichlet_alpha}"
    return f"{method}-{heterogeneity}-seed{loop.seed}"


class Experiment:
    """A ``fit`` config made into a run. ``resume_from``: a run directory to continue."""

    def __init__(self, cfg: Namespace, parser: Optional[ArgumentParser] = None, resume_from: Optional[Path] = None):
        parser = parser or fit_parser()
        init = parser.instantiate(cfg)  # constructors check their arguments: ConfigError before any work
        self.config: dict[str, Any] = cfg.clone().as_dict()
        self.config.pop("config", None)
        self.config_yaml = parser.dump(cfg, skip_unset=False)  # keep null keys: the saved config is complete
        self.logger: LoggerConfig = init.logger
        self.checkpoint: CheckpointConfig = init.checkpoint
        self.loop = FederationLoop(**vars(init.federation), data=init.data, model=cfg.model.as_dict(),
                                   client=init.client, aggregator=init.aggregator, seed=cfg.seed)
        self.resume_from = Path(resume_from) if resume_from is not None else None
        self.run_path: Optional[Path] = None
        self.checkpointer: Optional[Checkpointer] = None

    def setup(self) -> None:
        """Build the clients, then (and only then, once nothing can fail on bad input) the run
        directory and the observers; on resume, check and load the checkpoint first."""
        loop = self.loop
        user_callbacks = list(loop.callbacks)
        loop.setup()
        self.name = self.logger.name or default_run_name(loop)
        state = None
        if self.resume_from is not None:
            state = load_checkpoint(self.resume_from / CHECKPOINT)
            check_resumable(loop, self.config, state)
            self.run_path = self.resume_from
        else:
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
            self.run_path = Path(self.logger.run_dir) / f"{stamp}-{self.name}"
        if state is not None:
            print(f"fdlit: resuming {self.run_path} after round {state['loop']['round']} of {loop.rounds}",
                  file=sys.stderr)
            truncate_to_round(self.run_path, state["loop"]["round"])
            restore_checkpoint(loop, state)  # sets the random state round r+1 starts from: nothing below draws
        wandb = WandbLogger(self.logger, self.config, self.run_path, self.name,
                            run_id=state["wandb_run_id"] if state else None)
        self.identity = {"run": self.name, "run_dir": str(self.run_path)}
        directory = RunDirectory(self.run_path, self.config_yaml, self.identity,
                                 messages_written=len(loop.ledger.messages))
        self.checkpointer = Checkpointer(self.run_path, self.config, wandb.current_run_id, self.checkpoint,
                                         saved_round=state["loop"]["round"] if state else None)
        loop.callbacks = [
            directory, wandb, *([ProgressBar()] if self.logger.progress else []), *user_callbacks,
            self.checkpointer,  # last: saves the next round's RNG
        ]

    def fit(self) -> dict[str, Any]:
        self.setup()
        return {**self.identity, **self.loop.fit()}

    def run(self) -> dict[str, Any]:
        """``fit`` for the command line: print the summary; a numerical fault says how to resume."""
        try:
            summary = self.fit()
        except NumericalFault as exc:
            where = f"; metrics of earlier rounds are in {self.run_path}" if self.run_path else ""
            saved = None
            if self.checkpointer is not None:
                try:
                    self.checkpointer.wait()  # the last checkpoint may still be being written
                except Exception as write_error:
                    where += f"; writing the last checkpoint failed too ({type(write_error).__name__}: {write_error})"
                saved = self.checkpointer.saved_round
            raise NumericalFault(f"{exc}{where}\n{resume_hint(self.run_path, saved)}") from None
        print(format_summary(summary))
        return summary


def resume_experiment(run_dir: str, overrides: list[str]) -> Experiment:
    """The experiment of ``run_dir``, rebuilt from its config.yaml with the same parser as ``fit``."""
    for arg in overrides:
        if arg.startswith("-") and arg.split("=", 1)[0] not in RESUME_FLAGS:
            raise CheckpointError(
                f"{arg.split('=', 1)[0]} cannot be changed when resuming (config and seed come from the run "
                f"directory); allowed with --resume: {', '.join(RESUME_FLAGS)}"
            )
    path = Path(run_dir)
    if not path.is_dir():
        raise CheckpointError(f"no run directory {run_dir!r}")
    if not (path / CONFIG).exists():
        raise CheckpointError(f"{run_dir} has no {CONFIG}; is it an fdlit run directory?")
    if not (path / CHECKPOINT).exists():
        raise CheckpointError(f"{run_dir} has no {CHECKPOINT}: no round of that run completed, start it anew")
    parser, cfg = parse_fit(["--config", str(path / CONFIG), *overrides])
    return Experiment(cfg, parser, resume_from=path)
