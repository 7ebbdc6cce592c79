"""What a run records: a round's metrics and the run's summary are JSON values (numbers, strings,
flags, None, and lists and dicts of them), as ``metrics.jsonl`` and ``summary.json`` hold them."""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"
Metrics: TypeAlias = "dict[str, JSON]"  # a round's metrics, or the run's summary, by name

__all__ = ["JSON", "Metrics"]
