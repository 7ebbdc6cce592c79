"""Node-side checkpoints: a node keeps its own clients' states; the server keeps which round it saved.

When a round ends in a checkpoint (``checkpoint.every_n_rounds``), each node writes the states of the
clients it hosts (weights, optimizer, random generator, the method's client state) to its own disk,
and replies with the round it saved, not the states: the server's checkpoint holds, for each client,
a stub naming the run's key and that round. The last round's states still travel up with its last
reply, so the finished run's checkpoint holds every client's state (what ``fdlit export``, reports
and ``fit --resume`` read). On ``deploy --resume`` the server sends each node the rounds to restore
and the node loads them from its disk.

Layout: ``<checkpoint-dir>/<run key>/round-<r>-clients-<first>-<last>.pt`` (``checkpoint-dir``: the
node setting; default ``<state-dir>/fdlit-checkpoints``), written atomically (a temporary file,
fsync, rename, fsync of the folder): after a kill at any moment the last complete file is readable.
A node keeps each client's newest ``KEEP`` saved rounds, so the server's last complete checkpoint
(written in the background while the next round runs) always finds its round on the nodes, also for a
client saved long ago (asynchronous rounds save a client only when it has distilled).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from fdlit.execution.steps import ON_NODES as STUB  # a checkpoint's client state that names the node's file

KEEP = 3  # saved rounds a node keeps
FIELD = "node-config checkpoint-dir"


def is_stub(state: Any) -> bool:
    return isinstance(state, dict) and STUB in state


def stub(key: str, round: int) -> dict:
    return {STUB: {"key": key, "round": int(round)}}


def checkpoint_dir(node_config: dict) -> Path:
    """Where this node keeps its clients' checkpoints."""
    given = node_config.get("checkpoint-dir")
    if given:
        return Path(str(given))
    return Path(str(node_config.get("state-dir") or tempfile.gettempdir())) / "fdlit-checkpoints"


def run_folder(node_config: dict, key: str) -> Path:
    # the key comes from the server: a name of hex digits, never a path
    if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{8,64}", key):
        raise ValueError(f"a node checkpoint key must be hex digits, got {key!r}")
    return checkpoint_dir(node_config) / key


def save(node_config: dict, key: str, round: int, states: dict[int, Any]) -> Path:
    """Write ``states`` (client id -> state) of ``round`` atomically, a file per run of consecutive client
    ids (its name says exactly whose states it holds); keep each client's newest KEEP rounds."""
    from fdlit.runs.atomic_write import write_file

    folder = run_folder(node_config, key)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    ids = sorted(states)
    runs = [[ids[0]]]
    for i in ids[1:]:
        runs[-1].append(i) if i == runs[-1][-1] + 1 else runs.append([i])
    for run in runs:
        path = folder / f"round-{int(round)}-clients-{run[0]}-{run[-1]}.pt"
        content = {"round": int(round), "states": {int(i): states[i] for i in run}}
        write_file(path, lambda f, c=content: torch.save(c, f), field=FIELD, sync_folder=True)
    files = [(int(r), int(a), int(b), p) for p in folder.glob("round-*-clients-*.pt")
             for _, r, _, a, b in [p.stem.split("-")]]
    for r, a, b, p in files:  # gone once each of its clients has KEEP newer rounds
        if all(len({r2 for r2, a2, b2, _ in files if r2 > r and a2 <= c <= b2}) >= KEEP for c in range(a, b + 1)):
            p.unlink(missing_ok=True)
    return path


def load(node_config: dict, key: str, rounds: dict[int, int]) -> dict[int, Any]:
    """The saved states of the clients ``rounds`` names (client id -> round), from this node's disk;
    a ConfigError naming the clients, the round and the folder when some are not there."""
    from fdlit.errors import ConfigError

    folder = run_folder(node_config, key)
    found: dict[int, Any] = {}
    for r in sorted(set(rounds.values())):
        for path in sorted(folder.glob(f"round-{r}-clients-*.pt")):
            # weights_only: a file on disk is data, never code to run (as the server's checkpoints)
            saved = torch.load(path, map_location="cpu", weights_only=True)
            found.update({i: s for i, s in saved["states"].items() if rounds.get(i) == r})
    missing = sorted(i for i in rounds if i not in found)
    if missing:
        wanted = sorted({rounds[i] for i in missing})
        raise ConfigError(FIELD, f"this node has no saved state of clients {missing} of round(s) {wanted} under "
                          f"{folder} (the checkpoint's client states stay on the nodes that saved them: resume "
                          "on those nodes, with the same checkpoint-dir)")
    return found
