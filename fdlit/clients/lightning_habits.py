"""What a Lightning user reaches for, answered with fdlit's equivalent: a ``Trainer`` flag or
command fdlit does not have (``--trainer.max_epochs``, ``--ckpt_path``, ``fdlit validate``), and the
parts of a LightningModule that a federation does not call (``validation_step``, ``prog_bar``).

fdlit is no ``Trainer``: a run is rounds of a private and a public phase on every client, with
evaluation after each phase; the ``federation`` section holds what a Trainer's flags would."""

from __future__ import annotations

import inspect

EPOCHS = ("--federation.private_epochs and --federation.public_epochs (epochs of each phase per round; "
          "--federation.private_epochs_first and --federation.public_epochs_first for round 1) and "
          "--federation.rounds")
TRAINER_FLAGS = {
    "trainer.max_epochs": EPOCHS,
    "trainer.min_epochs": EPOCHS,
    "trainer.max_steps": EPOCHS,
    "trainer.accelerator": "--federation.accelerator",
    "trainer.devices": "--federation.devices",
    "trainer.precision": "--federation.precision",
    "trainer.strategy": "--federation.executor (how clients are trained: sequential, vectorized, Ray)",
    "trainer.callbacks": "--federation.callbacks (fdlit.callbacks.FederationCallback subclasses, per round)",
    "trainer.logger": "--logger.mode (W&B: online, offline, disabled; the run directory is always written)",
    "trainer.default_root_dir": "--logger.run_dir",
    "trainer.check_val_every_n_epoch": "--federation.eval_every_n_rounds (clients are evaluated after each phase)",
    "trainer.val_check_interval": "--federation.eval_every_n_rounds (clients are evaluated after each phase)",
    "trainer.limit_val_batches": "--federation.eval_subsample",
    "trainer.enable_checkpointing": "--checkpoint.every_n_rounds",
    "ckpt_path": "`fdlit fit --resume RUN_DIR` (or RUN_DIR/checkpoint-r<N>.pt, a kept checkpoint): the run's config "
                 "comes with it",
    "trainer.resume_from_checkpoint": "`fdlit fit --resume RUN_DIR`",
}
TRAINER_ANY = ("fdlit has no trainer section: --federation.* holds rounds, epochs per phase, devices and precision "
               "(`fdlit fit --help`)")
EVALUATED = ("fdlit evaluates every client after each phase of every round (metrics.jsonl, summary.json); "
             "`fdlit export RUN_DIR --out model.pt` writes a trained network to evaluate elsewhere")
COMMANDS = {"validate": EVALUATED, "test": EVALUATED, "predict": "`fdlit export RUN_DIR --out model.pt` writes a "
            "trained network (TorchScript with its input step) to predict with", "tune": "`fdlit sweep FILE`"}


def flag_hint(flag: str) -> str | None:
    """The fdlit equivalent of a Lightning flag (``trainer.max_epochs``, ``--ckpt_path``), or None."""
    name = flag.lstrip("-").split("=", 1)[0]
    if name in TRAINER_FLAGS:
        return f"fdlit's equivalent: {TRAINER_FLAGS[name]}"
    return TRAINER_ANY if name == "trainer" or name.startswith("trainer.") else None


def command_hint(command: str) -> str | None:
    """What to use instead of a Lightning CLI subcommand fdlit does not have."""
    return COMMANDS.get(command.strip("'\""))


# a LightningModule's hooks that only a Trainer's loops call: fdlit's rounds do not
UNCALLED = {
    "validation_step": "fdlit evaluates forward's logits on each client's test split and the global test set "
                       "after each phase (clients/*/acc in metrics.jsonl)",
    "test_step": "fdlit's evaluation uses forward (after each phase, every round)",
    "predict_step": "an exported network (`fdlit export`) predicts with forward",
    "on_validation_epoch_end": "fdlit calls no validation loop",
}


def own_module_notes(module) -> list[str]:
    """One line for each part of a user's LightningModule that fdlit does not use, saying what it
    does instead (printed once at the start of a run)."""
    from lightning.pytorch import LightningModule

    cls = type(module)
    notes = [f"{cls.__name__}.{hook} is not called: {why}" for hook, why in UNCALLED.items()
             if getattr(cls, hook, None) is not getattr(LightningModule, hook, None)]
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # defined where no source is kept (a notebook, exec)
        source = ""
    if "prog_bar=True" in source.replace(" ", ""):
        notes.append(f"{cls.__name__}: self.log(..., prog_bar=True) is shown in no progress bar: fdlit's bar counts "
                     "rounds and clients; every logged value is in metrics.jsonl and W&B as clients/log/<name>")
    return notes
