from fdlit.loggers.progress import ProgressBar
from fdlit.loggers.run_directory import RunDirectory, read_jsonl
from fdlit.loggers.wandb_logger import LoggerConfig, WandbLogger

__all__ = ["LoggerConfig", "ProgressBar", "RunDirectory", "WandbLogger", "read_jsonl"]
