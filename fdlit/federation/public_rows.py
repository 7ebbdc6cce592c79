"""The rule that keeps a method's server state honest under a per-round public subset.

With ``participation.public_fraction`` (or ``public_subset``) each round's uploads cover other rows of
the public set. A server part that keeps a tensor over one round's rows (an EMA of the teacher, say)
and reuses it next round would mix different public samples. So, under a public subset, a server part
declares the state it keeps per public sample (``Aggregator.row_state``: attribute -> the dimension
that runs over the full public set, indexed by ``FederationInfo.public_ids``; None for state that is
not per public sample). After each ``aggregate`` the round checks, without guessing from shapes:

* every attribute holding tensors that ``aggregate`` created, rebound or changed in place is
  declared (tensors inside lists, tuples and dicts included, however deep);
* every tensor of a declared attribute has the full public set's size along its declared dimension.

Either failure stops the run in one line, before the state is used with other rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from fdlit.errors import ConfigError

if TYPE_CHECKING:
    from fdlit.methods.base import Aggregator

Fingerprint = tuple[object, ...]  # what identifies a tensor's storage, version and shape, inside its containers

SUBSET = "participation.public_fraction / public_subset"


def fingerprint(value: object) -> Fingerprint | None:
    """What changes when a tensor is rebound, resized or written in place, inside any containers
    (None: ``value`` holds no tensor)."""
    if isinstance(value, torch.Tensor):
        return id(value), value._version, tuple(value.shape)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    inner = tuple((k, f) for k, v in items if (f := fingerprint(v)) is not None)
    return (id(value), inner) if inner else None


def tensors(value: object) -> Iterator[torch.Tensor]:
    """Every tensor inside ``value`` (containers of any depth)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple, dict)):
        for v in value.values() if isinstance(value, dict) else value:
            yield from tensors(v)


class PublicRowsGuard:
    """Checks a server part's per-public-sample state after each ``aggregate`` of a round that sees
    only a subset of the public set (see the module docstring)."""

    def __init__(self, public_size: int):
        self.public_size = public_size
        self.before: dict[str, Fingerprint | None] | None = None

    def before_aggregate(self, method: Aggregator, round: int, public_index: torch.Tensor | None) -> None:
        subset = public_index is not None and len(public_index) < self.public_size
        self.before = {k: fingerprint(v) for k, v in vars(method).items()} if subset and hasattr(method, "__dict__") else None

    def after_aggregate(self, method: Aggregator, round: int, public_index: torch.Tensor | None) -> None:
        if self.before is None:
            return
        declared = dict(method.row_state)
        name = type(method).__name__
        for attr, value in vars(method).items():
            now = fingerprint(value)
            if now is None:
                continue
            if attr not in declared:
                if now != self.before.get(attr):
                    raise ConfigError("aggregator", (
                        f"{name} keeps {attr} (tensors its aggregate changed in round {round}) without declaring "
                        f"whether it is per public sample, and this round's public samples are a subset ({SUBSET}); "
                        f"declare row_state = {{{attr!r}: dim}} (the dim that runs over the full public set, indexed "
                        f"by ctx.info.public_ids()) or {{{attr!r}: None}} (not per public sample) (docs/extending.md)"))
                continue
            dim = declared[attr]
            if dim is None:
                continue
            for t in tensors(value):
                if t.dim() <= dim or t.shape[dim] != self.public_size:
                    rows = t.shape[dim] if t.dim() > dim else "no"
                    raise ConfigError("aggregator", (
                        f"{name} keeps {attr} (per public sample along dim {dim}) with {rows} rows in round "
                        f"{round}, and the full public set has {self.public_size} ({SUBSET}: each round sees "
                        f"{len(public_index)}); keep it over the full public set indexed by ctx.info.public_ids() "
                        "(docs/extending.md), or run without a per-round public subset"))
