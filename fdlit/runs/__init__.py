"""Runs: the run directory, checkpoints, W&B and progress that observe a loop, and the experiment
that assembles them from a config (and resumes it)."""

from fdlit.runs.directory import RunDirectory, read_jsonl
from fdlit.configuration.run_settings import LoggerConfig
from fdlit.runs.progress import ProgressBar
from fdlit.runs.wandb_logger import WandbLogger

__all__ = ["LoggerConfig", "ProgressBar", "RunDirectory", "WandbLogger", "read_jsonl"]
