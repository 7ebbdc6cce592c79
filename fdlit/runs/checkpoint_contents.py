"""What a checkpoint holds besides the loop's own state, as tensors and plain data only (so that
``torch.load(weights_only=True)`` reads it): the client states packed into a few large tensors, the
global random states, and the checksum of the whole (:mod:`fdlit.runs.checkpoint`)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


# ---------------------------------------------------------------------------------- checksum
def content_digest(state: Any) -> str:
    """sha256 of a checkpoint's contents: every tensor's dtype, shape and bytes and every plain
    value, in order; the same for the state written and the state read back."""
    h = hashlib.sha256()
    _digest(state, h)
    return h.hexdigest()


def _digest(obj: Any, h: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}".encode())
        h.update(t.view(torch.uint8).numpy())  # hashlib reads the buffer: no copy
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k, v in obj.items():
            _digest(k, h)
            _digest(v, h)
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _digest(v, h)
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        h.update(f"S{len(data)}:".encode() + data)
    else:  # numbers, None, booleans, dtypes
        text = repr(obj).encode()
        h.update(f"V{type(obj).__name__}{len(text)}:".encode() + text)


# ---------------------------------------------------------------------------------- random states
def rng_state() -> dict[str, Any]:
    """Global random states as tensors and plain data (numpy's array becomes an int64 tensor)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------- packed client states
def _split(obj: Any, path: tuple, paths: list, tensors: list) -> Any:
    """``obj`` with every tensor replaced by None (the skeleton); tensors and their paths appended."""
    if isinstance(obj, torch.Tensor):
        paths.append(path)
        tensors.append(obj)
        return None
    if isinstance(obj, dict):
        out = type(obj)((k, _split(v, path + (k,), paths, tensors)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # module versions in a state_dict (load_state_dict reads them)
            out._metadata = obj._metadata
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, path + (i,), paths, tensors) for i, v in enumerate(obj))
    return obj


def _fill(skeleton: Any, path: tuple, at: dict, tensors: list) -> Any:
    """The inverse of :func:`_split`: the skeleton with ``tensors[at[path]]`` put back."""
    if path in at:
        return tensors[at[path]]
    if isinstance(skeleton, dict):
        out = type(skeleton)((k, _fill(v, path + (k,), at, tensors)) for k, v in skeleton.items())
        if hasattr(skeleton, "_metadata"):
            out._metadata = skeleton._metadata
        return out
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_fill(v, path + (i,), at, tensors) for i, v in enumerate(skeleton))
    return skeleton


def pack_client_states(states: list[dict]) -> dict:
    """Client states as a few large CPU tensors (a copy: later training does not change it).

    Clients whose states have the same structure (keys, plain values, tensor shapes, dtypes and
    devices) form a group, and each state tensor is stacked across the group's clients. A
    homogeneous federation is one group: one tensor per weight, Adam moment, step count and
    generator state, however many clients. Clients that differ (another architecture, an optimizer
    that has not stepped yet, a method state of another shape) get their own groups; a client that
    matches no other is a group of one, i.e. stored per client."""
    groups: list[dict] = []
    by_key: dict[tuple, dict] = {}
    for i, state in enumerate(states):
        paths: list = []
        tensors: list = []
        skeleton = _split(state, (), paths, tensors)
        key = (repr(skeleton), tuple((p, tuple(t.shape), t.dtype, t.device) for p, t in zip(paths, tensors, strict=True)))
        group = by_key.get(key)
        if group is None:
            group = by_key[key] = {"clients": [], "skeleton": skeleton, "paths": paths, "members": []}
            groups.append(group)
        group["clients"].append(i)
        group["members"].append(tensors)
    packed = []
    for g in groups:
        stacked = [_stack_on_cpu([m[k].detach() for m in g["members"]]) for k in range(len(g["paths"]))]
        packed.append({"clients": g["clients"], "skeleton": g["skeleton"], "paths": g["paths"], "tensors": stacked})
    return {"num_clients": len(states), "groups": packed}


def _stack_on_cpu(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack on the CPU. Device tensors are copied into the CPU stack one by one, so packing
    never holds a second copy of every client's state in device memory."""
    if tensors[0].device.type == "cpu":
        return torch.stack(tensors)
    out = torch.empty((len(tensors), *tensors[0].shape), dtype=tensors[0].dtype)
    for row, t in zip(out, tensors, strict=True):
        row.copy_(t)
    return out


def unpack_client_states(packed: dict) -> list[dict]:
    """The per-client states :func:`pack_client_states` was given, equal tensor for tensor; every
    client's tensors are its own (clones, not views of the stacked ones)."""
    states: list[Any] = [None] * packed["num_clients"]
    for g in packed["groups"]:
        at = {tuple(p): k for k, p in enumerate(g["paths"])}
        for j, client in enumerate(g["clients"]):
            tensors = [t[j].clone() for t in g["tensors"]]
            states[client] = _fill(g["skeleton"], (), at, tensors)
    return states


def _detached(obj: Any) -> Any:
    """Tensors cloned (to the CPU), containers copied: a snapshot training cannot change."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _detached(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_detached(v) for v in obj)
    return obj
