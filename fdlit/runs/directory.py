"""The local run directory every run writes, W&B or not; resume, sweep and report read it.
This module is the only code that knows its file names.

    <run_dir>/config.yaml         resolved config, written before training starts
    <run_dir>/metrics.jsonl       one JSON object per round, appended and fsynced as each round ends
    <run_dir>/communication.jsonl one JSON object per message (round, client, direction, kind, bytes)
    <run_dir>/summary.json        best/final numbers so far, replaced atomically every round
    <run_dir>/checkpoint.pt       the state after the last checkpointed round (fdlit.runs.checkpoint)
    <run_dir>/checkpoint-r<N>.pt  earlier checkpoints kept (``checkpoint.keep``)
    <run_dir>/wandb/              W&B's own files (offline runs)

A crash or kill leaves every completed round readable.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import yaml

from fdlit.callbacks import FederationCallback

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
COMMUNICATION = "communication.jsonl"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"


def round_checkpoint(round: int) -> str:
    """File name of the kept checkpoint of ``round``."""
    return f"checkpoint-r{round}.pt"


def kept_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(round, path) of the kept checkpoints in ``run_dir``, oldest first."""
    out = []
    for path in Path(run_dir).glob("checkpoint-r*.pt"):
        number = path.name[len("checkpoint-r"):-len(".pt")]
        if number.isdigit():
            out.append((int(number), path))
    return sorted(out)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_jsonl(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; a torn last line (killed mid-write) is ignored."""
    rows = []
    if not Path(path).exists():
        return rows
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def read_config(run_dir: Path) -> dict:
    return yaml.safe_load((Path(run_dir) / CONFIG).read_text()) or {}


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / SUMMARY).read_text())


def truncate_to_round(run_dir: Path, round: int) -> None:
    """Drop rows written after ``round`` (a kill between the metrics and the checkpoint writes) and a
    torn last line, so resumed rounds append to exactly the checkpointed history."""
    for name in (METRICS, COMMUNICATION):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        rows = [row for row in read_jsonl(path) if row.get("round", 0) <= round]
        write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))


class RunDirectory(FederationCallback):
    """Writes the run directory as the federation proceeds. ``messages_written``: ledger messages
    already in communication.jsonl (a resumed run appends only the new ones)."""

    def __init__(self, path: Path, config_yaml: str, identity: dict[str, Any], messages_written: int = 0):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / CONFIG, config_yaml)
        self.identity = identity  # run name and directory, first in every summary
        self._messages_written = messages_written

    def summary(self, loop) -> dict[str, Any]:
        return {**self.identity, **loop.summary()}

    def on_round_end(self, loop, round, metrics):
        append_jsonl(self.path / METRICS, [metrics])
        append_jsonl(self.path / COMMUNICATION, loop.ledger.rows(self._messages_written))
        self._messages_written = len(loop.ledger.messages)
        write_atomic(self.path / SUMMARY, json.dumps(self.summary(loop), indent=2, default=_jsonable))

    def on_fit_end(self, loop, summary):
        write_atomic(self.path / SUMMARY, json.dumps({**self.identity, **summary}, indent=2, default=_jsonable))
