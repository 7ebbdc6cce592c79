"""``deploy``'s own options checked before any process starts: each bad value is one
:class:`~fdlit.errors.ConfigError` naming the option and what it allows (``fdlit: error: ...``, exit 2).
"""

from __future__ import annotations

import argparse
import math
import re
import socket
from pathlib import Path

from fdlit.errors import ConfigError

REACH_TIMEOUT_S = 3.0  # how long --superlink may take to accept a connection
LAUNCHER_NODE_KEYS = ("partition-id", "num-partitions")  # set by the launcher for each SuperNode


class OptionParser(argparse.ArgumentParser):
    """argparse whose errors are one ConfigError line naming the option, not a usage dump."""

    def error(self, message: str):
        found = re.match(r"argument (\S+?)(?:/\S+)?: (.*)", message)
        if found:
            raise ConfigError(f"deploy {found.group(1)}", found.group(2))
        raise ConfigError("deploy", message)


def check_options(options, num_clients: int | None) -> None:
    """Every deploy option; ``num_clients``: the config's client count (None where unknown)."""
    for name in ("timeout", "node_wait", "run_timeout"):
        value = getattr(options, name)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"deploy --{name.replace('_', '-')}", f"must be a number of seconds > 0, got {value:g}")
    if options.threads < 0:
        raise ConfigError("deploy --threads", f"must be >= 0 (0: torch's default), got {options.threads}")
    if options.nodes < 1:
        raise ConfigError("deploy --nodes", f"must be >= 1, got {options.nodes}")
    check_node_count(options, num_clients)
    if options.work_dir is not None and Path(options.work_dir).exists() and not Path(options.work_dir).is_dir():
        raise ConfigError("deploy --work-dir", f"must be a folder (or a path to create one at), got the file "
                          f"{options.work_dir}")
    if options.root_certificates is not None and not Path(options.root_certificates).is_file():
        raise ConfigError("deploy --root-certificates", f"must be a CA certificate file (PEM); no file "
                          f"{options.root_certificates}")
    if options.node_config is not None:
        if options.superlink is not None:
            raise ConfigError("deploy --node-config", "applies to the SuperNodes started here; with --superlink, "
                              "each node's operator sets it on flower-supernode --node-config")
        options.node_settings = node_settings(options.node_config)
    else:
        options.node_settings = {}
    if options.superlink is not None:
        check_reachable(*superlink_address(options.superlink))


def check_node_count(options, num_clients: int | None) -> None:
    """Every node hosts at least one of the config's ``num_clients`` clients (None: not known yet)."""
    if num_clients is not None and options.nodes > num_clients:
        raise ConfigError("deploy --nodes", f"must be between 1 and data.num_clients ({num_clients}): every node "
                          f"hosts at least one client; got {options.nodes}")


def superlink_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port)."""
    found = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^\s:\[\]]+):(\d+)", text)
    port = int(found.group(2) or found.group(4)) if found else 0
    if not found or not 1 <= port <= 65535:
        raise ConfigError("deploy --superlink", f"must be HOST:PORT with a port in 1..65535 (e.g. 10.0.0.1:9092, "
                          f"[::1]:9092), got {text!r}")
    return found.group(1) or found.group(3), port


def check_reachable(host: str, port: int) -> None:
    """Something accepts connections at host:port (a SuperLink's Fleet and Control API), within a few seconds."""
    try:
        with socket.create_connection((host, port), timeout=REACH_TIMEOUT_S):
            return
    except TimeoutError:
        reason = f"no answer within {REACH_TIMEOUT_S:g} s"
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    raise ConfigError("deploy --superlink", f"nothing listens on {host}:{port} ({reason}); start the SuperLink "
                      "there first, or leave --superlink out to start one here")


def node_settings(text: str) -> dict:
    """``--node-config "key=value ..."`` for every SuperNode started here, checked: ``data-dir`` an
    existing folder, ``idle-timeout`` seconds > 0; ``partition-id`` and ``num-partitions`` are the
    launcher's. Other keys (e.g. ``allowed-classes``) go to the nodes as they are."""
    from flwr.common.config import parse_config_args

    try:
        settings = parse_config_args([text])
    except Exception as exc:  # Flower's TOML reading: any error is a malformed value
        raise ConfigError("deploy --node-config", f"must be space-separated key=value pairs (strings quoted), "
                          f"got {text!r}: {exc}") from None
    if not settings and text.strip():
        raise ConfigError("deploy --node-config", f"must be space-separated key=value pairs, got {text!r}")
    for key in LAUNCHER_NODE_KEYS:
        if key in settings:
            raise ConfigError(f"deploy --node-config {key}", "is set by the launcher for each SuperNode (0..N-1)")
    if "data-dir" in settings:
        folder = Path(str(settings["data-dir"]))
        if not folder.is_dir():
            raise ConfigError("deploy --node-config data-dir", f"must be an existing folder with the dataset's "
                              f"files, got {str(folder)!r} ({'a file' if folder.exists() else 'no such folder'})")
    if "idle-timeout" in settings:
        value = settings["idle-timeout"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError("deploy --node-config idle-timeout", f"must be a number of seconds > 0, got {value!r}")
    for key, value in settings.items():
        if isinstance(value, str) and ("'" in value or '"' in value):
            raise ConfigError(f"deploy --node-config {key}", f"cannot hold a quote character, got {value!r}")
    return settings
