"""Reading a YAML file a user gave (``--config``, a run's ``config.yaml``, a sweep file) strictly.

YAML parsers accept more than a config should: PyYAML and jsonargparse keep the last of two equal
keys (``federation:`` twice silently loses the first section), an empty file is an empty config,
and bytes that are not UTF-8 end in a ``UnicodeDecodeError`` traceback. Here each of these is a
:class:`~fdlit.errors.ConfigError` naming the file and the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fdlit.configuration.bounded_yaml import BoundedComposer, BoundedSafeLoader, BoundExceeded, mark_line, read_bounded
from fdlit.errors import ConfigError


class _UniqueKeyLoader(BoundedComposer, yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice, at any depth, within fdlit's bounds
    (:mod:`fdlit.configuration.bounded_yaml`)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges; not a key of its own
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first != line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, field: str = "config") -> dict[str, Any]:
    """The mapping in the YAML file ``path``; anything else is a one-line ConfigError for ``field``
    naming the file (and the line where there is one)."""
    path = Path(path)
    raw = read_bounded(path, field)  # a regular file within the size and line caps
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(field, f"{path}, line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
                          "a config is a YAML file") from None
    if not text.strip() or all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()):
        raise ConfigError(field, f"{path} is empty; a config is a YAML mapping such as 'seed: 0'")
    try:
        value = yaml.load(text, Loader=_UniqueKeyLoader)
    except BoundExceeded as exc:
        raise ConfigError(field, f"{path}{mark_line(exc)}: {exc.problem}; not a config fdlit reads") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = mark_line(exc)
        problem = " ".join(str(getattr(exc, "problem", None) or str(exc).splitlines()[0]).split())
        context, opened = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and opened is not None and opened is not mark:  # where the unclosed bracket or block began
            problem += f"; {context} from line {opened.line + 1}"
        raise ConfigError(field, f"{path}{where}: not valid YAML ({problem})") from None
    if not isinstance(value, dict):
        raise ConfigError(field, f"{path} must hold a YAML mapping (keys and values such as 'seed: 0'), "
                          f"not a {type(value).__name__}")
    return value


def key_line(path: str | Path, dotted: str, value: str | None = None) -> int | None:
    """The line (1-based) of the key ``dotted`` (e.g. ``data.num_client``) in the YAML file ``path``, or
    None when the file does not hold it (with ``value``: holds it with that scalar value). ``init_args``
    levels may be written or left out, and a key may itself be dotted (``data.num_clients: 5``), as
    jsonargparse accepts both."""
    try:
        root = yaml.compose(read_bounded(path).decode("utf-8"), Loader=BoundedSafeLoader)
    except (ConfigError, UnicodeDecodeError, yaml.YAMLError):
        return None
    want = [p for p in dotted.split(".") if p != "init_args"]

    def walk(node, prefix: list[str]) -> int | None:
        if not isinstance(node, yaml.MappingNode):
            return None
        for key, value_node in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            here = prefix + [p for p in str(key.value).split(".") if p != "init_args"]
            if here == want and (value is None or getattr(value_node, "value", None) == value):
                return key.start_mark.line + 1
            if want[:len(here)] == here:
                found = walk(value_node, here)
                if found is not None:
                    return found
        return None

    return walk(root, [])


PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the fdlit package


def shipped_configs() -> Path | None:
    """fdlit's own ``configs/`` folder (beside the package in a source checkout or an editable install);
    None when fdlit was installed as a wheel, which does not ship it."""
    folder = PACKAGE_ROOT.parent / "configs"
    return folder if (folder / "datasets").is_dir() else None


def listed_file(path: str, entry: str) -> Path:
    """Where an entry of ``path``'s ``config:`` list is: beside ``path`` first (a copied config with its
    parts copied too, or a part changed locally), then fdlit's shipped ``configs/`` (a copied config whose
    parts are fdlit's own)."""
    local = Path(path).resolve().parent / entry
    if local.exists() and not local.is_dir():  # a pipe or device too: the bounded reader refuses it, naming it
        return local
    shipped = shipped_configs()
    if shipped is not None and (shipped / entry).is_file():
        return shipped / entry
    where = (f"nor in fdlit's configs/ ({shipped / entry})" if shipped is not None else
             "and this fdlit has no configs/ folder to fall back on (installed as a package, which does not ship "
             "it: copy the part beside the file, or install fdlit from a checkout with `pip install -e .`)")
    raise ConfigError("config", f"{path} lists {entry!r}, which is neither beside it ({local}) {where}")
