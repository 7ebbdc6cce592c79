"""Where a run's results go: the run directory's parent and the W&B settings (the ``logger`` section)."""

from __future__ import annotations

from typing import Literal, Optional

from fdlit.errors import ConfigError

Mode = Literal["auto", "online", "offline", "disabled"]


class LoggerConfig:
    """Where a run's results go.

    Args:
        mode: W&B mode: ``auto`` (online if credentials are configured, else offline), ``online``,
            ``offline`` or ``disabled``. The local run directory is written in every mode.
        project: W&B project.
        entity: W&B entity (team or user); null uses your default.
        name: run name; null gives ``<aggregator>-k<k>-seed<seed>``.
        group: W&B group (seeds of one setting share a group).
        tags: W&B tags.
        run_dir: parent folder of local run directories.
        progress: show a progress bar over rounds and clients.
    """

    def __init__(
        self,
        mode: Mode = "auto",
        project: str = "fdlit",
        entity: Optional[str] = None,
        name: Optional[str] = None,
        group: Optional[str] = None,
        tags: list[str] = [],
        run_dir: str = "runs",
        progress: bool = True,
    ):
        if mode not in ("auto", "online", "offline", "disabled"):
            raise ConfigError("logger.mode", f"allowed: auto, online, offline, disabled; got {mode!r}")
        self.mode = mode
        self.project = project
        self.entity = entity
        self.name = name
        self.group = group
        self.tags = list(tags)
        self.run_dir = run_dir
        self.progress = progress
