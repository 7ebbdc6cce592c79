"""Ranges of the methods' temperature knobs, checked on the parsed ``fit`` config before anything is
built into a run, after the constructors' own checks (fit, resume and every sweep combination go through
:class:`fdlit.runs.experiment.Experiment`).

A method's constructor accepts any finite ``tau >= 0`` or ``temperature > 0``, but its rule computes
``softmax(tau * l)`` (sUWA's log-likelihood weights; LKD and F2L scale AUCs the same way) or
``softmax(z / T)`` (a KD or ERA temperature) in float32: ``tau = 1e308`` or ``T = 1e-300`` makes inf
there, and the NaN that follows surfaces later as a numerical fault blamed on a client. Within these
ranges the products stay finite, and the ends already are the limits they approach: at ``tau = 1e4``
sUWA gives all weight to the most likely client, at ``T = 1e-6`` a softmax is an argmax and at
``T = 1e6`` uniform.
"""

from __future__ import annotations

import math
from typing import Any

from fdlit.errors import ConfigError

# init argument -> (lowest, highest) allowed, for fdlit's own methods (a class of one's own checks itself)
KNOB_RANGES = {"tau": (0.0, 1e6), "temperature": (1e-6, 1e6)}


def check_knob_ranges(section: str, spec: Any) -> None:
    """Refuse a temperature-like init argument of ``spec`` (a parsed ``class_path`` / ``init_args``
    section, e.g. the aggregator) outside :data:`KNOB_RANGES`, naming the field and the range."""
    class_path = getattr(spec, "class_path", None)
    init_args = getattr(spec, "init_args", None)
    if not isinstance(class_path, str) or not class_path.startswith("fdlit.") or init_args is None:
        return
    values = init_args if isinstance(init_args, dict) else vars(init_args)
    for name, (low, high) in KNOB_RANGES.items():
        value = values.get(name)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # not this method's knob, or a type the parser already refused
        if not (math.isfinite(value) and low <= value <= high):
            raise ConfigError(f"{section}.{name}", f"allowed: a finite number in [{low:g}, {high:g}] (beyond it "
                              f"float32 overflows in the rule's softmax); got {value!r}")
