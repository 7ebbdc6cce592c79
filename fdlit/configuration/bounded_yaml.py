"""Reading a YAML file (or value) someone gave fdlit within fixed bounds, so that no input can hang
or exhaust the process that reads it: config files and their ``config:`` layers, a section given as
a file, sweep files, a config a deployed node receives, and every YAML value jsonargparse loads
(a command-line value included).

- only a regular file is opened, without blocking (a FIFO, ``/dev/zero``, a folder are refused unread);
- at most :data:`MAX_BYTES` are read, and no line is longer than :data:`MAX_LINE`;
- the document is composed node by node: more than :data:`MAX_NODES` nodes or a nesting deeper than
  :data:`MAX_DEPTH` stops it at once (a 2,000,000-entry list, a 100,000-deep list);
- aliases may share parts, but the document with every alias expanded holds at most
  :data:`MAX_VALUES` values (an alias bomb is refused before it is constructed or copied).

Each refusal is a :class:`~fdlit.errors.ConfigError` of one line naming the file (and line).
The caps are far above any config fdlit ships (the largest is 2 KiB, ~150 values).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from fdlit.errors import ConfigError

KiB = 2**10
MAX_BYTES = 1024 * KiB
MAX_LINE = 64 * KiB
MAX_NODES = 20_000
MAX_DEPTH = 64
MAX_VALUES = 100_000


class BoundExceeded(yaml.YAMLError):
    """A document beyond one of the caps (raised while composing, with the place it was reached)."""

    def __init__(self, problem: str, mark=None):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


def read_bounded(path: str | Path, field: str = "config", what: str = "a config is a short YAML file") -> bytes:
    """The bytes of the regular file ``path``; a special file, a file over :data:`MAX_BYTES` or with a
    line over :data:`MAX_LINE` is a one-line ConfigError for ``field``."""
    path = Path(path)
    with open_regular(path, field, what) as f:
        try:
            data = f.read(MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(field, f"{path} is larger than {MAX_BYTES // KiB} KiB, the most fdlit reads of it; {what}")
    check_line_length(data, f"{path}", field)
    return data


def open_regular(path: Path, field: str, what: str):
    """``path`` opened for binary reading when it is a regular file outside /proc and /sys, else a
    one-line ConfigError for ``field`` (``what``: what the file should have been)."""
    try:
        # O_NONBLOCK: opening a FIFO never waits for a writer; it is then refused as not regular
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise ConfigError(field, f"{path} is not a regular file (a device, pipe, socket or folder); {what}")
    if is_kernel_file(path):
        f.close()
        raise ConfigError(field, f"{path} is a file of the kernel (/proc, /sys), not one a user wrote; {what}")
    return f


def is_kernel_file(path: Path) -> bool:
    """Whether ``path`` (links followed) is in /proc or /sys: files whose size says nothing of what a
    read returns (``/proc/self/mem``, ``/proc/kcore``)."""
    try:
        parts = Path(path).resolve().parts
    except (OSError, RuntimeError):
        return False
    return len(parts) > 1 and parts[1] in ("proc", "sys")


def check_arguments(argv: list[str], file_options: tuple[str, ...]) -> None:
    """Every value of a command line (``--key value``, ``--key=value``) within the bounds of a config
    file: the value of one of ``file_options`` (a section or a class, which jsonargparse loads from a
    file when the value names one) that names a file is read as a config file is (a regular file,
    not in /proc, within the size and line caps) and its text checked; any other value is checked as
    YAML text. A ConfigError of one line naming the option otherwise."""
    for at, arg in enumerate(argv):
        if not arg.startswith("--") or len(arg) == 2:
            continue
        if "=" in arg:
            name, value = arg[2:].split("=", 1)
        elif at + 1 < len(argv) and not argv[at + 1].startswith("--"):
            name, value = arg[2:], argv[at + 1]
        else:
            continue
        if name == "config":  # read as a config file (fdlit.configuration.files)
            continue
        loads_files = name in file_options or name.endswith(".init_args")
        if loads_files and _names_a_file(value):
            what = "a section given as a file is a short YAML file"
            raw = read_bounded(value, name, what)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = raw[: exc.start].count(b"\n") + 1
                raise ConfigError(name, f"{value}, line {line}: not UTF-8 text; {what}") from None
            check_text(text, value, name)
        else:
            check_text(value, "its YAML text", name)


def _names_a_file(value: str) -> bool:
    """Whether ``value`` names something other than a folder on this machine (a special file too)."""
    if not value or "\n" in value or len(value) > 4096 or "\0" in value:
        return False
    try:
        return not stat.S_ISDIR(os.stat(value).st_mode)
    except (OSError, ValueError):
        return False


def check_line_length(data: bytes | str, where: str, field: str) -> None:
    newline = b"\n" if isinstance(data, bytes) else "\n"
    start = 0
    for number in range(1, len(data) + 2):
        end = data.find(newline, start)
        stop = len(data) if end < 0 else end
        if stop - start > MAX_LINE:
            raise ConfigError(field, f"{where}, line {number}: longer than {MAX_LINE // KiB} KiB, the most fdlit reads "
                              "of one line")
        if end < 0:
            return
        start = end + 1


class BoundedComposer:
    """Mixin for a PyYAML loader: composing stops past :data:`MAX_NODES` nodes or :data:`MAX_DEPTH` levels,
    and a composed document that expands (aliases) to more than :data:`MAX_VALUES` values is refused
    before anything is constructed from it."""

    def compose_document(self):
        self._fdlit_nodes, self._fdlit_depth = 0, 0
        node = super().compose_document()
        if expanded_size(node, MAX_VALUES) > MAX_VALUES:
            raise BoundExceeded(f"it expands to more than {MAX_VALUES:,} values (YAML aliases repeat shared parts); "
                                "a config holds far fewer", getattr(node, "start_mark", None))
        return node

    def compose_node(self, parent, index):
        self._fdlit_nodes += 1
        self._fdlit_depth += 1
        try:
            if self._fdlit_depth > MAX_DEPTH:
                raise BoundExceeded(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            if self._fdlit_nodes > MAX_NODES:
                raise BoundExceeded(f"more than {MAX_NODES:,} values", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._fdlit_depth -= 1


def expanded_size(node, budget: int) -> int:
    """Values in the composed ``node`` with every shared (aliased) node counted each time it occurs,
    computed once per distinct node; stops past ``budget``."""
    sizes: dict[int, int] = {}

    def size(n) -> int:
        known = sizes.get(id(n))
        if known is not None:
            return known
        sizes[id(n)] = budget + 1  # a node that holds itself (a recursive alias) is beyond any budget
        total = 1
        if isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        elif isinstance(n, yaml.SequenceNode):
            children = n.value
        else:
            children = []
        for child in children:
            total += size(child)  # recursion depth: at most MAX_DEPTH, as composed
            if total > budget:
                break
        sizes[id(n)] = total
        return total

    return size(node) if node is not None else 0


class BoundedSafeLoader(BoundedComposer, yaml.SafeLoader):
    """``yaml.SafeLoader`` within the caps."""


class TextBeyondBounds(ValueError):
    """YAML text (a command-line value) beyond the caps; jsonargparse names the option it was given to."""


def check_text(text: str, where: str = "its YAML text", field: str | None = None) -> None:
    """Refuse YAML text beyond the caps (its size, a line, values, depth, aliases) without constructing it:
    a ConfigError for ``field``, or (None) a :class:`TextBeyondBounds`. Text that is no valid YAML
    passes (whoever loads it reports that)."""

    def refuse(message: str):
        return ConfigError(field, message) if field else TextBeyondBounds(message)

    if len(text) > MAX_BYTES:
        raise refuse(f"{where} is longer than {MAX_BYTES // KiB} KiB, the most fdlit reads of it")
    try:
        check_line_length(text, where, "value")
    except ConfigError as exc:
        raise refuse(str(exc).removeprefix("value: ")) from None
    loader = BoundedSafeLoader(text)
    try:
        loader.get_single_node()
    except BoundExceeded as exc:
        raise refuse(f"{where}{mark_line(exc)}: {exc.problem}") from None
    except yaml.YAMLError:
        pass
    finally:
        loader.dispose()


def mark_line(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f", line {mark.line + 1}" if mark is not None else ""
