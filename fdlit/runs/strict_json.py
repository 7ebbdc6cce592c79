"""Strict JSON for every file fdlit writes: NaN and ±inf become ``null``.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which are not JSON: ``jq``, browsers
and most other languages refuse such a file. A metric that has no value (a round not evaluated, a
teacher with no upload) is ``null`` instead, and ``allow_nan=False`` makes any value this misses an
error rather than an invalid file.
"""

from __future__ import annotations

import json
import math
from typing import Any


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (also numpy's and 0-d tensors') replaced by None;
    containers are copied, other values kept (``default`` of :func:`dumps` handles the rest)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return strict(value.item())  # numpy scalars (float32 is no float subclass) and 0-d tensors
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict` ``(value)``; never writes NaN or Infinity."""
    kwargs.setdefault("default", str)
    return json.dumps(strict(value), allow_nan=False, **kwargs)
