"""The rule that keeps a method's server state honest under a per-round public subset.

With ``participation.public_fraction`` each round's uploads cover other rows of the public set. A
server part that keeps a tensor over one round's rows (an EMA of the teacher, say) and reuses it next
round would silently mix different public samples. The round refuses that, in one line, before the
method aggregates again: state kept across rounds must be indexed by public sample ids
(``FederationInfo.public_ids``) over the full public set.
"""

from __future__ import annotations

from typing import Any

import torch

from fdlit.errors import ConfigError


def row_tensors(obj: Any, rows: int) -> dict[str, torch.Tensor]:
    """Tensors with ``rows`` rows among ``obj``'s attributes (and one level inside dicts, lists, tuples)."""
    found: dict[str, torch.Tensor] = {}
    for name, value in vars(obj).items():
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
        for key, inner in [(None, value), *items]:
            if isinstance(inner, torch.Tensor) and inner.dim() >= 1 and inner.shape[0] == rows:
                found[name if key is None else f"{name}[{key!r}]"] = inner
    return found


class PublicRowsGuard:
    """Remembers which tensors the server part made in the last round's ``aggregate`` with one row per
    public sample of that round (state it had before, e.g. set-up data, is not the round's rows)."""

    def __init__(self, public_size: int):
        self.public_size = public_size
        self.kept: dict[str, torch.Tensor] = {}
        self.before: set[int] = set()
        self.last_round = 0

    def before_aggregate(self, method: Any, round: int, public_index: torch.Tensor | None) -> None:
        """Refuse when a tensor kept over the last round's public rows is still held and the rows changed."""
        if public_index is None or not hasattr(method, "__dict__"):
            return
        self.before = {id(t) for t in row_tensors(method, len(public_index)).values()}
        if not self.kept:
            return
        held = {id(t) for t in row_tensors(method, len(next(iter(self.kept.values())))).values()}
        stale = [name for name, t in self.kept.items() if id(t) in held]
        if stale:
            raise ConfigError(
                "aggregator", f"{type(method).__name__} keeps {', '.join(stale)} (one row per public sample of round "
                f"{self.last_round}) for round {round}, whose public samples differ (participation.public_fraction); "
                "keep it over the full public set indexed by ctx.info.public_ids() (docs/extending.md), or run without "
                "a per-round public subset")

    def after_aggregate(self, method: Any, round: int, public_index: torch.Tensor | None) -> None:
        rows = self.public_size if public_index is None else len(public_index)
        subset = public_index is not None and rows < self.public_size
        made = row_tensors(method, rows) if subset and hasattr(method, "__dict__") else {}
        self.kept = {name: t for name, t in made.items() if id(t) not in self.before}
        self.last_round = round
