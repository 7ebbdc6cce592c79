"""Where fdlit leans on another project's private names: checked at first use, with a fallback said once.

fdlit uses a few names that Lightning's, lightning_utilities' and Flower's public APIs do not offer
(listed in docs/dependencies.md, each with what it buys). Each use first checks that the name is
there, has the signature fdlit expects, and (where it can be checked cheaply) behaves as expected;
when one is not, :class:`MovedInternal` says what differs, the caller falls back to the dependency's
public behaviour (slower, never different results), and :func:`fell_back` says so on stderr, once
per process and fallback.
"""

from __future__ import annotations

import inspect
import sys

_said: set[str] = set()


class MovedInternal(Exception):
    """A private name fdlit uses is not what it expects (renamed, moved, another signature)."""


def fell_back(what: str) -> None:
    """One line on stderr, once per process: what fdlit does instead of using a moved internal."""
    if what not in _said:
        _said.add(what)
        print(f"fdlit: note: {what}", file=sys.stderr, flush=True)


def expect_function(owner, name: str, parameters: tuple[str, ...] = ()):
    """``owner.name``, checked to be a function whose parameters include ``parameters`` (by name)."""
    where = f"{getattr(owner, '__name__', owner)}.{name}"
    fn = getattr(owner, name, None)
    if not callable(fn):
        raise MovedInternal(f"{where} is gone")
    try:
        have = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise MovedInternal(f"{where} has no signature to check") from None
    missing = [p for p in parameters if p not in have]
    if missing:
        raise MovedInternal(f"{where} takes no {', '.join(missing)}")
    return fn


def check_keyword_defaults(fn, *names: str) -> None:
    """Each of ``names`` must be a keyword-only parameter of ``fn`` with a default: changing the default of
    a name it does not have (or of one that is not keyword-only) would change nothing."""
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
    defaults = getattr(fn, "__kwdefaults__", None) or {}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    unknown = [n for n in names if n not in defaults
               or n not in params or params[n].kind is not inspect.Parameter.KEYWORD_ONLY]
    if unknown:
        raise MovedInternal(f"{where} has no keyword-only default {', '.join(unknown)}")


def set_keyword_defaults(fn, **values) -> None:
    """Change keyword-only defaults of ``fn`` (:func:`check_keyword_defaults` first: an unknown name is an error)."""
    check_keyword_defaults(fn, *values)
    fn.__kwdefaults__.update(values)
