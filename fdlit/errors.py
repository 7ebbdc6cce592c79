"""Errors fdlit raises: bad configuration (before any work starts) and numerical faults (which client, round, phase)."""

import math


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the dotted field and what is allowed."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


def check_number(field: str, value: float, *, minimum: float = 0.0, inclusive: bool = False) -> float:
    """Raise ConfigError unless ``value`` is finite and > minimum (>= with ``inclusive``)."""
    import math

    ok = math.isfinite(value) and (value >= minimum if inclusive else value > minimum)
    if not ok:
        relation = ">=" if inclusive else ">"
        raise ConfigError(field, f"must be a finite number {relation} {minimum:g}, got {value}")
    return value


def check_choice(field: str, value, allowed) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``, naming them."""
    if value not in allowed:
        raise ConfigError(field, f"allowed: {', '.join(map(str, allowed))}; got {value!r}")


def check_at_least(field: str, value: int, minimum: int) -> int:
    """Raise ConfigError unless ``value >= minimum`` (counts: clients, epochs, sizes)."""
    if value < minimum:
        raise ConfigError(field, f"must be >= {minimum}, got {value}")
    return value


def import_hint(message: str) -> str:
    """For an error whose class path names a module Python cannot find (a user's own module, not
    fdlit's): how Python finds it. Empty otherwise."""
    import re

    missing = re.search(r"No module named '([^'.]+)", message)
    if missing is None or missing.group(1) == "fdlit":
        return ""
    return (f" (a class of your own is imported by its module path: run from the folder that holds "
            f"{missing.group(1)}.py or its package, or put that folder on PYTHONPATH; docs/extending.md)")


class NumericalFault(RuntimeError):
    """A client produced NaN or inf; names the client, round and phase."""


def check_finite(values, r: int, phase: str, ids: list[int] | None = None) -> None:
    """Raise :class:`NumericalFault` naming the first client whose value (a loss, or logits) is not finite."""
    import torch

    for i, v in enumerate(values):
        bad = not torch.isfinite(v).all() if isinstance(v, torch.Tensor) else not math.isfinite(v)
        if bad:
            raise NumericalFault(f"client {i if ids is None else ids[i]} produced NaN/inf in round {r}, "
                                 f"phase '{phase}'")


class UnknownConfigKey(ConfigError):
    """A key in a config file that is no option: the message starts with the file and line that hold it."""

    def __init__(self, field: str, message: str, file: str, line: int):
        super().__init__(field, message)
        self.file, self.line = file, line
        self.args = (f"{file}:{line}: {field}: {message}",)
