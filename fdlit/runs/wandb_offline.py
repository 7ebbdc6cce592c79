"""One offline folder per W&B run: the sessions of a run resumed offline, merged into its first folder.

wandb writes a folder per session, ``offline-run-<start>-<id>`` (``-1``, ``-2`` after it when two
start within the same second), and never writes into one that exists (``set_sync_dir_suffix`` in
``wandb/sdk/wandb_init.py``), so a run resumed offline has one folder per session. Once a session
has ended, its folder is merged into the run's first one:

* its transaction log ``run-<id>.wandb`` becomes ``run-<id>-<start>.wandb`` there;
* its ``files/`` go over the first folder's ``files/``: a file both sessions wrote is the later
  session's, as it ends up on the W&B server when the sessions are uploaded in order;
* its ``logs/`` (wandb's debug logs) become ``logs-<start>/``.

Why the merged folder uploads as the separate ones do: ``wandb sync <folder>`` takes every ``.wandb``
file of the folder (``_expand_wandb_files`` in ``wandb/cli/beta_sync.py``); wandb-core groups the
files of one run and uploads them one after the other in the order their sessions started
(``initAndPlan`` in ``core/internal/runsync/runsyncoperation.go``), and reads the files a log names
from ``files/`` beside it (``MakeSyncSettings``, ``runsync/syncsettings.go``). A folder holding
anything else than those three and wandb's empty ``tmp/`` is left as it is.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

SESSION_PARTS = {"files", "logs", "tmp"}  # besides the .wandb log: what wandb writes in a session's folder


def session_folders(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline folders of ``run_id`` in ``wandb_dir``, oldest session first."""
    pattern = re.compile(rf"offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    found = []
    for folder in Path(wandb_dir).glob(f"offline-run-*-{run_id}*"):
        match = pattern.fullmatch(folder.name)
        if match and folder.is_dir() and not folder.is_symlink():
            found.append(((match.group(1), int(match.group(2) or 0)), folder))
    return [folder for _, folder in sorted(found)]


def merge_sessions(wandb_dir: Path, run_id: str) -> list[Path]:
    """Merge every later session folder of ``run_id`` into its first; the folders merged (now gone)."""
    folders = session_folders(wandb_dir, run_id)
    if len(folders) < 2:
        return []
    first, merged = folders[0], []
    for later in folders[1:]:
        parts = {p.name for p in later.iterdir()}
        logs = [later / name for name in parts if name.endswith(".wandb")]
        if len(logs) != 1 or parts - SESSION_PARTS - {logs[0].name}:
            continue  # not one plain session: leave it for `wandb sync` as it is
        stamp = later.name.removeprefix("offline-run-").removesuffix(f"-{run_id}").replace(f"-{run_id}-", "-")
        os.replace(logs[0], first / f"run-{run_id}-{stamp}.wandb")
        _move_tree(later / "files", first / "files")
        if (later / "logs").is_dir():
            os.replace(later / "logs", first / f"logs-{stamp}")
        shutil.rmtree(later)
        _repoint_links(Path(wandb_dir), later, first, stamp)
        merged.append(later)
    return merged


def _move_tree(source: Path, target: Path) -> None:
    """Every file under ``source`` to the same place under ``target`` (replacing what is there)."""
    if not source.is_dir():
        return
    for path in sorted(source.rglob("*")):
        if path.is_file() or path.is_symlink():
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, destination)


def _repoint_links(wandb_dir: Path, old: Path, new: Path, stamp: str) -> None:
    """wandb's ``latest-run``, ``debug.log`` and ``debug-internal.log`` links to the merged folder."""
    for link in wandb_dir.iterdir():
        if not link.is_symlink():
            continue
        target = os.readlink(link)
        if target == old.name or target.startswith(old.name + os.sep):
            rest = target[len(old.name):].lstrip(os.sep)
            rest = rest.replace("logs", f"logs-{stamp}", 1) if rest.startswith("logs") else rest
            link.unlink()
            link.symlink_to(Path(new.name) / rest if rest else Path(new.name))
