"""The local run directory every run writes, W&B or not; later tools (report, resume) read it.

    <run_dir>/config.yaml         resolved config, written before training starts
    <run_dir>/metrics.jsonl       one JSON object per round, appended and fsynced as each round ends
    <run_dir>/communication.jsonl one JSON object per message (round, client, direction, kind, bytes)
    <run_dir>/summary.json        best/final numbers so far, replaced atomically every round

A crash or kill leaves every completed round readable.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from fdlit.callbacks import FederationCallback


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


class RunDirectory(FederationCallback):
    """Writes the run directory as the federation proceeds."""

    def __init__(self, path: Path, config_yaml: str):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / "config.yaml", config_yaml)
        self._messages_written = 0

    def on_round_end(self, loop, round, metrics):
        append_jsonl(self.path / "metrics.jsonl", [metrics])
        append_jsonl(self.path / "communication.jsonl", loop.ledger.rows(self._messages_written))
        self._messages_written = len(loop.ledger.messages)
        write_atomic(self.path / "summary.json", json.dumps(loop.summary(), indent=2, default=_jsonable))

    def on_fit_end(self, loop, summary):
        write_atomic(self.path / "summary.json", json.dumps(summary, indent=2, default=_jsonable))
