"""Where a sweep writes: its runs in ``<logger.run_dir>/<sweep name>/`` (``runs/<sweep name>/`` by
default) unless its flags name ``--logger.run_dir``, and its bookkeeping (results file, lock) in that
folder's ``.sweep/``, never among the run folders (:mod:`fdlit.sweeps.controller` runs the sweep)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fdlit.errors import ConfigError
from fdlit.runs.directory import RunLock, safe_name
from fdlit.runs.run_files import SWEEP_BOOKKEEPING


class SweepInUse(ConfigError):
    """The same sweep is already running on this folder."""

    def __init__(self, folder: Path, holder: str):
        super().__init__("sweep", f"this sweep is already running on {folder} ({holder}); wait for it to end and "
                         "run the command again: finished runs are skipped, so nothing runs twice")


RUN_DIR_FLAG = "--logger.run_dir"


def results_path(folder: Path, name: str) -> Path:
    """Where the sweep records every combination's outcome: in its folder's ``.sweep/``."""
    return Path(folder) / SWEEP_BOOKKEEPING / f"sweep-{safe_name(str(name))}.json"


def names_run_dir(token: str) -> bool:
    return token == RUN_DIR_FLAG or token.startswith(RUN_DIR_FLAG + "=")


def place_runs(runs: list[Any], name: str, parser_factory: Callable) -> str:
    """Give every combination the sweep's own folder, ``<logger.run_dir>/<sweep name>``, unless its
    flags name ``--logger.run_dir`` (then that folder is the sweep's). A sweep started before sweeps
    had their own folder (its results file directly in ``<logger.run_dir>``) continues there. Returns
    a line for the user when that is so (else empty)."""
    from fdlit.configuration.schema import rewrite_config_args

    if not runs or any(names_run_dir(t) for r in runs for t in r.argv):
        return ""
    parser = parser_factory()
    parser.exit_on_error = False
    try:  # the config's parent of run directories; a bad combination is named by resolve()
        root = Path(str(parser.parse_args(rewrite_config_args(runs[0].argv))["logger.run_dir"]))
    except Exception:  # noqa: BLE001 - resolve() parses again and reports the error in one line
        return ""
    folder, file = root / safe_name(str(name)), results_path(root, name).name
    if not folder.exists() and ((root / file).is_file() or (root / SWEEP_BOOKKEEPING / file).is_file()):
        return (f"fdlit sweep {name}: continuing in {root}/, where this sweep was started before sweeps had a "
                f"folder of their own ({folder}/); to start it anew there: -- {RUN_DIR_FLAG} {folder}")
    for run in runs:
        at = next(i for i, t in enumerate(run.argv) if t.startswith("--logger.name="))
        run.argv.insert(at + 1, f"{RUN_DIR_FLAG}={folder}")
    return ""


def adopt_old_bookkeeping(folder: Path, results: Path) -> None:
    """Move a results file an earlier fdlit left among the run folders into ``.sweep/`` (its lock file
    is removed, unless an older fdlit still holds it: then this sweep is running already)."""
    old = folder / results.name
    if old.is_file() and not old.is_symlink() and not results.exists():
        os.replace(old, results)
    old_lock = folder / results.with_suffix(".lock").name
    if old_lock.is_file() and not old_lock.is_symlink():
        held = RunLock(folder, old_lock.name, SweepInUse).acquire()  # held by an older fdlit: in use
        try:
            old_lock.unlink()
        finally:
            held.release()
