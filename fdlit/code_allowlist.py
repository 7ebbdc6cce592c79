"""Which code a run's config may make fdlit import, checked on the config as it resolves, before anything
of it is imported.

A config names code in many spellings, all of which jsonargparse or fdlit import: a ``class_path`` at
any depth, the short form of a class field (``model: x.Y``, ``aggregator: x.Y``, ``federation.executor:
x.Y``, ``federation.callbacks: [x.Y]``), ``federation.client_class: x.Y``, dotted keys
(``model.class_path: x.Y``), a section given as the path of a YAML file that names a class, and the
files of a top-level ``config:`` list. :func:`config_code` resolves all of them without importing: it
reads every file involved (through :mod:`fdlit.bounded_yaml`), splits dotted keys and collects each
name with the key that gave it. A :class:`CodeAllowlist` then refuses a name outside it, in one line
naming the key and the file.

Whoever reads a run's config without having written it applies an allow-list: a deployed node
(the classes of fdlit's a received config may construct, :mod:`fdlit.constructible`, and its
operator's ``allowed-classes`` prefixes) and ``export`` (those classes, unless ``--trust_config``). ``report`` and ``sweep`` import nothing a run folder's config names.

The same walk refuses a section that is not a mapping of options (``federation: 5``, ``client: null``,
``data: [1, 2]``) naming the key, for every config fdlit parses.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import site
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdlit.constructible import DOTTED, NOT_ON_A_NODE, constructible, fdlit_class, fdlit_object, full_name
from fdlit.errors import ConfigError

# the fit schema's option groups: each is a mapping of its options (a test compares them with the parser)
GROUPS = ("data", "client", "federation", "privacy", "adversaries", "server", "logger", "checkpoint")
# fields whose value names a class to import (``x.Y``, ``{class_path: x.Y}``, or a list of them)
CODE_FIELDS = ("model", "server.model", "aggregator", "federation.executor", "federation.callbacks",
               "federation.client_class", "federation.clock")
# the options whose command-line value jsonargparse loads from a file when it names one (a test compares them
# with the parser)
FILE_OPTIONS = (*GROUPS, "federation.participation", *CODE_FIELDS, "adversaries.attack")


@dataclass(frozen=True)
class CodeName:
    """A dotted name the config makes fdlit import: the key that gives it, the file that holds it.
    ``loose``: a dotted text inside a class's ``init_args`` (imported only if the class's argument
    is a class or callable), refused only where Python would find its module."""

    key: str
    name: str
    file: str
    loose: bool = False


def config_code(files: Iterable[str | Path], follow_files: bool = True) -> list[CodeName]:
    """Every dotted name the config files (in the order they apply) make fdlit import, with the files
    they list under ``config:`` and the files sections are given as; a section that is not a mapping is
    a ConfigError naming it. ``follow_files=False``: a ``config:`` list or a section given as a file is
    itself refused (a node builds the config the server sent, never files of its own machine)."""
    walk = _Walk(follow_files)
    for file in files:
        walk.file(Path(file), ())
    return walk.names


class _Walk:
    def __init__(self, follow_files: bool = True):
        self.follow_files = follow_files
        self.names: list[CodeName] = []
        self.reading: tuple[Path, ...] = ()

    def file(self, path: Path, at: tuple[str, ...]) -> None:
        from fdlit.config_files import read_yaml

        resolved = path.resolve()
        if resolved in self.reading:
            return  # a file that includes itself: config_layers names the loop
        self.reading = (*self.reading, resolved)
        try:
            self.value(read_yaml(path, "config"), at, path)
        finally:
            self.reading = self.reading[:-1]

    def value(self, value: Any, at: tuple[str, ...], file: Path) -> None:
        plain = tuple(p for p in at if p != "init_args")
        key = ".".join(at)
        if isinstance(value, dict):
            for k, v in value.items():
                if not at and k == "config":
                    self.layers(v, file)
                    continue
                self.value(v, (*at, *str(k).split(".")), file)
            return
        if len(plain) == 1 and plain[0] in GROUPS:
            if isinstance(value, str) and self.section_file(value, file, at):
                return
            kind = "null" if value is None else "a list" if isinstance(value, list) else repr(value)
            raise ConfigError(key, f"must be a mapping of its options (e.g. '{key}: {{...}}' with one option per "
                              f"line, or leave it out for the defaults); got {kind} in {file}")
        if isinstance(value, list):
            for item in value:
                self.value(item, at, file)
            return
        if not isinstance(value, str):
            return
        dotted = ".".join(plain)
        if at and at[-1] == "class_path" or dotted in CODE_FIELDS:
            if dotted in CODE_FIELDS and self.section_file(value, file, at):
                return
            if "." in value.strip():  # a bare class name is looked up among classes already imported
                self.names.append(CodeName(key, value.strip(), str(file)))
        elif "init_args" in at and DOTTED.fullmatch(value.strip()):
            self.names.append(CodeName(key, value.strip(), str(file), loose=True))

    def section_file(self, value: str, file: Path, at: tuple[str, ...]) -> bool:
        """A section given as a YAML file's path (relative to the file that names it, or to the working
        folder, as jsonargparse finds it): its contents walked in its place."""
        if not value.strip() or "\n" in value:
            return False
        for candidate in (file.parent / value, Path(value)):
            try:
                found = candidate.is_file() or candidate.is_fifo() or candidate.is_char_device()
            except OSError:
                found = False
            if found:
                self.refuse_file(".".join(at), value)
                self.file(candidate, at)
                return True
        return False

    def refuse_file(self, key: str, value: Any) -> None:
        if not self.follow_files:
            raise ConfigError(key, f"{value!r} names a file; a node builds the config the server sent, not files "
                              "of its own machine")

    def layers(self, listed: Any, file: Path) -> None:
        from fdlit.config_files import listed_file

        self.refuse_file("config", listed)
        entries = [listed] if isinstance(listed, str) else listed
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ConfigError("config", f"{file}: `config:` must be a file name or a list of file names, "
                              f"got {listed!r}")
        for entry in entries:
            self.file(listed_file(str(file), entry), ())


class CodeAllowlist:
    """The classes of fdlit's that a received config may construct (:mod:`fdlit.constructible`; on a
    node, ``on_node``, less those it never sets up) and the names under ``prefixes`` (``mylab.`` allows
    ``mylab.models.Net``). ``refusal``: how the one-line error goes on after the key (what to do); its
    ``{what}`` says why the first name is refused."""

    def __init__(self, prefixes: Iterable[str] = (), refusal: str = "", on_node: bool = False):
        self.prefixes = tuple(p.strip().rstrip("*") for p in prefixes if p.strip().rstrip("*").strip("."))
        self.refusal = refusal
        self.on_node = on_node

    def allows(self, name: str) -> bool:
        for prefix in self.prefixes:
            if name == prefix.rstrip(".") or name.startswith(prefix if prefix.endswith(".") else prefix + "."):
                return True
        return constructible(name, self.on_node)

    def refused(self, names: Iterable[CodeName]) -> list[CodeName]:
        return [n for n in names if not self.allows(n.name) and not (n.loose and not _importable_top(n.name))]

    def check(self, names: Iterable[CodeName], field: str | None = None) -> None:
        """A ConfigError for the first refused name (``field``: the error's field instead of the key)."""
        refused = self.refused(names)
        if refused:
            first = refused[0]
            raise ConfigError(field or first.key, self.refusal.format(
                name=first.name, key=first.key, file=first.file, names=sorted({n.name for n in refused}),
                what=why_refused(first.name, self.on_node)))


def check_config_files(files: Iterable[str | Path], allowlist: CodeAllowlist | None = None,
                       field: str | None = None, follow_files: bool = True) -> list[CodeName]:
    """Resolve the config ``files`` (sections checked to be mappings); with ``allowlist``, refuse the
    code outside it. The names back."""
    names = config_code(files, follow_files)
    if allowlist is not None:
        allowlist.check(names, field)
    return names


def why_refused(name: str, on_node: bool = False) -> str:
    """Why a received config may not name ``name``, in words that follow it."""
    obj = fdlit_object(name)
    if isinstance(obj, type) and on_node and full_name(obj) in NOT_ON_A_NODE:
        return f"is not set up on a node ({NOT_ON_A_NODE[full_name(obj)]})"
    if fdlit_class(name):
        return ("is a class of fdlit's that a received config may not construct (only methods, models, executors, "
                "attacks, clients and callbacks: it may write files)")
    return "is not a class of fdlit"


def _importable_top(name: str) -> bool:
    top = name.split(".", 1)[0]
    if top == "fdlit":
        return True
    try:
        return importlib.util.find_spec(top) is not None  # finds the file, runs nothing
    except (ImportError, ValueError):
        return False


class ImportGuard(importlib.abc.MetaPathFinder):
    """While active (``with ImportGuard(allowlist):``), a module that is not imported yet may be imported
    only from the Python installation (the standard library, site-packages), from fdlit, or under the
    allow-list's prefixes: whatever spelling reached an import the walk above did not foresee, a module
    planted beside the config or on the path (``evilmod.py``) is refused with an ImportError."""

    def __init__(self, allowlist: CodeAllowlist):
        self.allowlist = allowlist
        packages = getattr(site, "getsitepackages", lambda: [])()
        roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *packages, site.getusersitepackages(),
                 str(Path(__file__).resolve().parent)}
        self.roots = tuple(str(Path(r).resolve()) + os.sep for r in roots if r)

    def find_spec(self, name, path=None, target=None):
        if name == "fdlit.__main__" and name not in sys.modules:  # importing it runs the command line
            raise ImportError("fdlit.__main__ is never imported for a config", name=name)
        if name in sys.modules or name.split(".", 1)[0] == "fdlit" or any(
                name == p.rstrip(".") or name.startswith(p if p.endswith(".") else p + ".") or
                p.startswith(name + ".") for p in self.allowlist.prefixes):
            return None  # the usual finders decide
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        origin = spec.origin or ""
        locations = [origin] if spec.has_location else list(spec.submodule_search_locations or [])
        if all(str(Path(p).resolve()).startswith(self.roots) for p in locations if p):
            return None
        raise ImportError(f"{name} ({origin or locations}) is outside this reader's allow-list; nothing outside "
                          "the Python installation, fdlit and the allowed prefixes is imported here", name=name)

    def __enter__(self):
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc):
        sys.meta_path.remove(self)
        return False
