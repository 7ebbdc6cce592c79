"""How a run is recorded: the ``logger`` section (where results go, W&B), the ``checkpoint`` section
(when the checkpoint is written) and the rule a run's name follows. Plain settings, checked on
construction; the runs layer (``fdlit.runs``) acts on them."""

from __future__ import annotations

import math
import re
from typing import Literal

from fdlit.errors import ConfigError, check_at_least

# a run name becomes one folder name: no separators, no "..", nothing a shell or W&B trips on
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=,-]*")
NAME_RULE = "letters, digits and . _ - + = , (starting with a letter or digit)"
MAX_NAME = 120


def check_run_name(field: str, name: str) -> str:
    """Refuse a run name that is not one plain folder name (``../x``, ``a/b``, empty, too long)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or len(name) > MAX_NAME:
        raise ConfigError(field, f"must be 1 to {MAX_NAME} characters: {NAME_RULE}, so that it names one "
                          f"folder; got {name!r}")
    return name


Mode = Literal["auto", "online", "offline", "disabled"]
PROJECT_FORBIDDEN = "/\\#?%:"  # what W&B refuses in a project name (wandb.Settings.validate_project)
MAX_PROJECT = 128


def check_project(project: str) -> str:
    if not project or len(project) > MAX_PROJECT or any(c in project for c in PROJECT_FORBIDDEN):
        raise ConfigError("logger.project", f"must be 1 to {MAX_PROJECT} characters without any of "
                          f"{' '.join(PROJECT_FORBIDDEN)} (W&B's rule); got {project!r}")
    return project


class LoggerConfig:
    """Where a run's results go.

    Args:
        mode: W&B mode: ``auto`` (online if credentials are configured, else offline), ``online``,
            ``offline`` or ``disabled``. The local run directory is written in every mode.
        project: W&B project.
        entity: W&B entity (team or user); null uses your default.
        name: run name, also part of the run directory's name (letters, digits and ``. _ - + = ,``);
            null gives ``<rule>-k<k>-<dataset>-<setting hash>-seed<seed>``, with the rule's and the
            model's non-default arguments (``suwa-tau0.5-k2-digits-hidden64-1a2b3c-seed0``).
        group: W&B group (seeds of one setting share a group).
        tags: W&B tags.
        run_dir: parent folder of local run directories.
        progress: show a progress bar over rounds and clients.
        init_timeout_s: seconds W&B may take to start a run; after that the run logs offline (online
            mode) or to the run directory only.
        trust_every_n_rounds: log the who-to-trust heatmap to W&B in round 1, every n-th round and
            the last (rendering it costs time; 0: never).
        trust_max_rows: above this many clients the heatmap has one row per class held (the clients
            holding it, averaged) instead of one row per client.
        system_metrics: W&B also samples the machine's CPU, GPU and memory use (every 15 s) and saves
            the installed packages (requirements.txt), as it does by default; off, it records the run's
            own metrics and its metadata (command, Python, git commit, host) only, ~0.3 CPU s cheaper.
        verbose: print W&B's own console output (its banners, run history and summary); off, fdlit
            prints one line per run saying where W&B logs it.
    """

    def __init__(
        self,
        mode: Mode = "auto",
        project: str = "fdlit",
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: list[str] = [],
        run_dir: str = "runs",
        progress: bool = True,
        init_timeout_s: float = 10.0,
        trust_every_n_rounds: int = 5,
        trust_max_rows: int = 40,
        system_metrics: bool = False,
        verbose: bool = False,
    ):
        if mode not in ("auto", "online", "offline", "disabled"):
            raise ConfigError("logger.mode", f"allowed: auto, online, offline, disabled; got {mode!r}")
        if name is not None:
            check_run_name("logger.name", name)
        if not isinstance(run_dir, str) or not run_dir.strip():
            raise ConfigError("logger.run_dir", f"must be a folder path (the parent of run directories); got {run_dir!r}")
        if not (math.isfinite(init_timeout_s) and init_timeout_s > 0):
            raise ConfigError("logger.init_timeout_s", f"must be a finite number of seconds > 0, got {init_timeout_s}")
        if isinstance(trust_every_n_rounds, bool) or not isinstance(trust_every_n_rounds, int) or trust_every_n_rounds < 0:
            raise ConfigError("logger.trust_every_n_rounds", f"must be an integer >= 0 (0: never); got {trust_every_n_rounds!r}")
        if isinstance(trust_max_rows, bool) or not isinstance(trust_max_rows, int) or trust_max_rows < 1:
            raise ConfigError("logger.trust_max_rows", f"must be an integer >= 1; got {trust_max_rows!r}")
        self.mode = mode
        self.project = check_project(project)
        self.entity = entity
        self.name = name
        self.group = group
        self.tags = list(tags)
        self.run_dir = run_dir
        self.progress = progress
        self.init_timeout_s = float(init_timeout_s)
        self.trust_every_n_rounds = trust_every_n_rounds
        self.trust_max_rows = trust_max_rows
        self.system_metrics = bool(system_metrics)
        self.verbose = bool(verbose)


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
