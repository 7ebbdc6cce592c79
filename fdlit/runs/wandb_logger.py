"""Weights & Biases, isolated here: nothing else in fdlit imports wandb.

One W&B run per experiment, owned by this callback. ``mode=auto`` logs online when credentials are
configured (WANDB_API_KEY or a netrc entry for the W&B host) and offline otherwise, with a one-line
hint on how to sync. ``disabled`` never imports wandb. A tracker failure never stops training, and
starting a run waits at most ``logger.init_timeout_s`` (wandb's ``init_timeout`` setting) before
going offline.

What the run records, locally and under ``wandb agent`` alike: the config as its dotted flags (the
agent's own key names, so a swept class keeps its ``init_args`` and nothing appears twice); a group
made of every setting but the seed; under the agent a name built from the swept values; a summary of
plain numbers (last value under the metric's own name, best as ``best/<metric>``); the per-client
table once, at the end; the trust heatmap every ``logger.trust_every_n_rounds``. Resuming a finished
run opens no W&B run; a run resumed offline keeps one offline folder, into which each session's
folder is merged when it ends (fdlit.runs.wandb_offline), and the offline sync hint names every
offline folder of the run directory.

``mode=online`` without credentials is refused before any work (:func:`check_credentials`): asking
for online and silently getting offline would hide that nothing is uploaded. An offline folder is
linked into W&B's own folder (``./wandb`` of the working directory, or ``$WANDB_DIR/wandb``), where a
bare ``wandb sync`` looks, and holds the run's config.yaml and printed summary as run files, so that
syncing uploads them too.
"""

from __future__ import annotations

import netrc
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional

from fdlit.callbacks import FederationCallback, RoundView
from fdlit.federation import format_summary
from fdlit.errors import ConfigError
from fdlit.runs.dashboards import SUMMARIES, accuracy_table_rows, run_summary, wandb_round_payload
from fdlit.runs.directory import safe_name
from fdlit.configuration.run_settings import LoggerConfig, Mode
from fdlit.runs.naming import flat, setting_digest, setting_hash, short
from fdlit.runs.wandb_costs import skip_unused_work, wandb_settings, without_field_docstrings
from fdlit.runs.wandb_offline import merge_sessions, session_folders


def wandb_host() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].split("/")[0]


def has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(wandb_host()) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def check_credentials(config: LoggerConfig) -> None:
    """``logger.mode: online`` needs credentials: a ConfigError before any work, not an offline run."""
    if config.mode == "online" and not has_wandb_credentials():
        raise ConfigError("logger.mode", f"online needs W&B credentials and there are none for {wandb_host()} (no "
                          "WANDB_API_KEY, no netrc entry): run `wandb login`, or set WANDB_API_KEY, or use "
                          "--logger.mode offline (or auto: online when credentials exist, else offline)")


def project_wandb_dir() -> Path:
    """The folder a bare ``wandb sync`` scans: ``wandb`` (or ``.wandb`` when that exists, as wandb
    chooses) in ``$WANDB_DIR`` or the working directory."""
    root = Path(os.environ.get("WANDB_DIR") or Path.cwd())
    return root / (".wandb" if (root / ".wandb").exists() else "wandb")


def link_offline_folder(folder: Path) -> Optional[Path]:
    """Link an offline run folder into the project's W&B folder (None: it is already there). Links
    whose run directory was deleted are removed; real folders are never touched."""
    index = project_wandb_dir()
    folder = folder.resolve()
    if index.resolve() == folder.parent:
        return None
    index.mkdir(parents=True, exist_ok=True)
    for old in index.glob("offline-run-*"):
        if old.is_symlink() and not old.exists():
            old.unlink()
    link = index / folder.name
    if not link.is_symlink() and not link.exists():
        link.symlink_to(folder, target_is_directory=True)
    return link


# wandb.init's reinit: a process runs one W&B run at a time, except stacked runs (fdlit.sweeps.stack), which
# open one each ("create_new") and keep a resumed offline run's sessions as separate folders (merging them
# restarts wandb's service under the other runs)
REINIT = "finish_previous"
WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # what wandb accepts


def resolve_mode(mode: Mode) -> str:
    env = os.environ.get("WANDB_MODE")
    if mode == "auto" and env in ("online", "offline", "disabled"):
        return env
    if mode == "auto":
        return "online" if has_wandb_credentials() else "offline"
    return mode


def redact(text: str) -> str:
    """Remove the W&B API key from text that may reach a terminal or a log."""
    key = os.environ.get("WANDB_API_KEY")
    return text.replace(key, "<WANDB_API_KEY>") if key and len(key) >= 4 else text


def swept_values() -> dict[str, Any]:
    """The values ``wandb agent`` chose for this run (its parameter file, ``{key: {"value": v}}``);
    empty outside the agent."""
    path = os.environ.get("WANDB_SWEEP_PARAM_PATH")
    if not os.environ.get("WANDB_SWEEP_ID") or not path:
        return {}
    try:
        import yaml

        from fdlit.configuration.bounded_yaml import BoundedSafeLoader, read_bounded

        params = yaml.load(read_bounded(path, "WANDB_SWEEP_PARAM_PATH"), Loader=BoundedSafeLoader) or {}
    except Exception:  # an unreadable (or unbounded) file: the default name still works
        return {}
    return {k: v.get("value") for k, v in params.items() if isinstance(v, dict) and k != "wandb_version"}


def names(config: LoggerConfig, flat_config: dict[str, Any], default_name: str) -> tuple[str, str]:
    """(run name, group). Given names win. Under the agent the name is built from the swept values
    (what differs between the sweep's runs); the group is every setting but the seed: the name
    without its seed, plus a hash of the whole config without seed and logger settings."""
    swept = swept_values()
    setting = [short(k, v) for k, v in swept.items() if k != "seed"]
    seed = f"seed{flat_config.get('seed')}"
    base = safe_name("-".join(setting)) if setting else re.sub(r"-seed-?\d+$", "", default_name)
    name = config.name or (safe_name(f"{base}-{seed}") if swept else default_name)
    group = config.group or safe_name(f"{base}-{setting_hash(flat_config)}")
    return name, group


class WandbLogger(FederationCallback):
    """Logs per-round metrics with ``round`` as the x-axis; last and best values as plain summaries."""

    def __init__(self, config: LoggerConfig, run_config: dict[str, Any], directory: Path, default_name: str,
                 run_id: Optional[str] = None):
        self.config = config
        self.run_id = run_id  # a resumed run continues its W&B run (id from the checkpoint)
        self.mode = resolve_mode(config.mode)
        # every setting, and the hash that names the setting in default run names (unique per setting)
        self.run_config = {**flat(run_config), "setting": setting_digest(run_config)}
        self.directory = Path(directory)
        self.name, self.group = names(config, self.run_config, default_name)
        self.run = None
        self.linked: Optional[Path] = None  # the offline folder's link in the project's W&B folder
        self._said: set[str] = set()

    def current_run_id(self) -> Optional[str]:
        """The W&B run id a resumed run continues (None without a W&B run)."""
        try:
            return str(self.run.id) if self.run is not None else self.run_id
        except Exception:  # a broken tracker must not stop a checkpoint
            return self.run_id

    def _say(self, message: str) -> None:
        """Print a tracker problem once per kind of problem; never echo a secret."""
        kind = message.split("(")[0]
        if kind in self._said:
            return
        self._said.add(kind)
        print(redact(message), file=sys.stderr)

    def _init(self, mode: str, run_id: Optional[str]):
        with without_field_docstrings():
            return self._start(mode, run_id)

    def _start(self, mode: str, run_id: Optional[str]):
        import wandb

        skip_unused_work(wandb)

        # wandb validates WANDB_MODE even when mode= is given: an empty or unknown value (e.g. an
        # exported but unset variable) would fail init; fdlit already resolved the mode
        env = os.environ.get("WANDB_MODE")
        if env is not None and env not in WANDB_MODES:
            self._say(f"fdlit: ignoring WANDB_MODE={env!r} (allowed: {', '.join(WANDB_MODES)}); using mode {mode}")
            del os.environ["WANDB_MODE"]

        # on resume, continue the same W&B run (id from the checkpoint)
        resume = {"id": run_id, "resume": "allow"} if run_id else {}
        # wandb waits 90 s for its service by default: bounded here, then the caller goes offline
        settings = wandb_settings(wandb, self.config)
        return wandb.init(
            project=self.config.project, entity=self.config.entity, name=self.name,
            group=self.group, tags=self.config.tags or None, config=self.run_config,
            dir=str(self.directory), mode=mode, reinit=REINIT, settings=settings, **resume,
        )

    def on_fit_start(self, view: RoundView):
        if self.mode == "disabled":
            return
        if view.round >= view.rounds:  # resuming a finished run: nothing to log, no empty W&B run
            print(f"fdlit: the run finished all {view.rounds} rounds; no W&B run opened "
                  "(--federation.rounds with more rounds continues it)", file=sys.stderr)
            return
        run_id = self.run_id
        if self.mode == "online":  # credentials were checked before any work (check_credentials)
            print(f"fdlit: starting the W&B run (waiting up to {self.config.init_timeout_s:g} s, then offline; "
                  "--logger.init_timeout_s changes it)", file=sys.stderr)
        try:
            self.run = self._init(self.mode, run_id)
        except Exception as exc:  # tracker faults (network, authentication) never kill training
            self.run = None
            if self.mode == "online":
                try:
                    self.run = self._init("offline", run_id)
                    self.mode = "offline"
                    self._say(f"fdlit: W&B online init failed ({exc}); continuing offline")
                except Exception:
                    pass
            if self.run is None:
                self._say(f"fdlit: W&B unavailable ({exc}); continuing with the local run directory only")
                return
        self.save_run_file("config.yaml", (self.directory / "config.yaml").read_text()
                           if (self.directory / "config.yaml").exists() else None)
        if not self.config.verbose:  # W&B itself is silent (wandb_settings): one line says where it logs
            print(f"fdlit: W&B logs this run {self.where()} (--logger.verbose true: W&B's own output)")
        try:
            self.run.define_metric("round")
            self.run.define_metric("*", step_metric="round")
            for metric, _ in SUMMARIES:  # summaries are written as plain numbers at the end
                self.run.define_metric(metric, step_metric="round")
        except Exception as exc:
            self._say(f"fdlit: W&B setup failed ({exc}); metrics stay in {self.directory}")

    def on_round_end(self, view: RoundView, round, metrics):
        if self.run is None:
            return
        try:
            import wandb

            classes = [cd.classes for cd in view.client_data]
            every = self.config.trust_every_n_rounds
            trust = every > 0 and (round == 1 or round % every == 0 or round == view.rounds)
            with without_field_docstrings():
                self.run.log(wandb_round_payload(wandb, metrics, classes, trust, self.config.trust_max_rows))
        except Exception as exc:  # keep trying next round (transient), but say it once
            self._say(f"fdlit: W&B log failed ({exc}); continuing, every metric is in {self.directory}")

    def on_fit_end(self, view: RoundView, summary):
        if self.run is None:
            return
        try:
            import wandb

            columns, rows = accuracy_table_rows(view.history, [cd.classes for cd in view.client_data])
            if rows:  # one table, every evaluated round: not a new table artifact each round
                with without_field_docstrings():  # the table's artifact imports wandb's artifact models
                    self.run.log({"clients/accuracy": wandb.Table(columns=columns, data=rows)})
        except Exception as exc:
            self._say(f"fdlit: W&B table failed ({exc}); every metric is in {self.directory}")
        self.save_run_file("summary.txt", format_summary({"run": self.name, "run_dir": str(self.directory), **summary})
                           if {"rounds", "best_global_acc_mean"} <= set(summary) else None)
        try:
            for key, value in run_summary(view.history).items():
                self.run.summary[key] = value
            for key, value in summary.items():
                if isinstance(value, (int, float, str)):
                    self.run.summary[f"final/{key}"] = value
            run_id = str(self.run.id)
            self.run.finish()
            if self.mode == "offline" and REINIT == "finish_previous":  # merging ends wandb's service: alone only
                self.merge_sessions(run_id)
                print(f"fdlit: W&B run saved offline; upload it with: {self.sync_command()}")
        except Exception as exc:
            self._say(f"fdlit: W&B finish failed ({exc}); every metric is in {self.directory}")

    def where(self) -> str:
        """Where the W&B run goes: its page online, its folder offline."""
        try:
            if self.mode == "online":
                return f"online at {self.run.url}"
            return f"offline in {Path(self.run.dir).parent}"
        except Exception:  # a tracker that cannot say: the run directory holds every metric anyway
            return f"{self.mode} (every metric is also in {self.directory})"

    def save_run_file(self, name: str, text: Optional[str]) -> None:
        """Write ``fdlit/<name>`` among the W&B run's files (uploaded live online, by ``wandb sync``
        offline), and link an offline folder into the project's W&B folder."""
        if self.run is None or text is None:
            return
        try:
            files = Path(self.run.dir)
            if files.name != "files" or not files.parent.name.startswith(("offline-run-", "run-")):
                return  # not W&B's own layout (<wandb>/<run folder>/files): nothing of ours goes there
            if self.mode == "offline":
                self.linked = link_offline_folder(files.parent)
            path = files / "fdlit" / name  # not files/config.yaml: W&B writes its own config there
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            self.run.save(str(path), base_path=str(files), policy="now")
        except Exception as exc:
            self._say(f"fdlit: W&B could not keep {name} ({type(exc).__name__}: {exc}); it is in {self.directory}")

    def merge_sessions(self, run_id: str) -> None:
        """A run resumed offline: its session folders made one, the first (fdlit.runs.wandb_offline)."""
        folders = session_folders(self.directory / "wandb", run_id)
        if len(folders) < 2:
            return
        import wandb

        wandb.teardown()  # wandb's service ends: every file of the session is written and closed
        if merge_sessions(self.directory / "wandb", run_id) and self.linked is not None:
            if self.linked.is_symlink() and not self.linked.exists():  # the link of a merged folder
                self.linked.unlink()
            self.linked = link_offline_folder(folders[0])

    def sync_command(self) -> str:
        """``wandb sync`` with every offline folder of this run directory (one per W&B run once a
        resumed run's sessions are merged; wandb sync takes them all in one call)."""
        folders = sorted((self.directory / "wandb").glob("offline-run-*"))
        command = "wandb sync " + " ".join(str(f) for f in folders or [self.directory / "wandb"])
        if self.linked is not None:
            command += f" (or a bare `wandb sync` in {self.linked.parent.parent}: every offline run linked there)"
        return command
