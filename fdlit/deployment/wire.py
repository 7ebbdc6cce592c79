"""What travels in a Flower Message: one ``ConfigRecord`` holding everything else as one JSON string
and every tensor of a request or reply in one byte string; and a message's real serialised size.

One record, not an ``ArrayRecord`` per tensor (or even one): Flower stores and forwards every record,
array and array chunk as an object of its own, and each object is one HTTP request from the sender
to the SuperLink and one from the SuperLink to the receiver. A message of one record is 3 objects
(the message, its record dict, the record); with the tensors in an ``ArrayRecord`` it was 6, and a
reply with each tensor an array of its own cost ~0.1 s of requests per array (measured: a 250 KB
reply of ~20 arrays took 2 s to reach the server). The JSON part lists each tensor's name, dtype,
shape and place in the bytes; bfloat16 and every other dtype travel as their raw bytes, exactly.
"""

from __future__ import annotations

import io
import json
from typing import Any

import torch

META, JSON, BLOB = "meta", "json", "tensors"
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


def pack(meta: dict[str, Any], tensors: dict[str, torch.Tensor]):
    """A ``RecordDict`` holding ``meta`` (JSON-serialisable) and ``tensors``."""
    from flwr.app import ConfigRecord, RecordDict

    layout, parts, offset = [], [], 0
    for key, t in tensors.items():
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        layout.append([key, str(t.dtype).removeprefix("torch."), list(t.shape), offset, raw.numel()])
        pad = -raw.numel() % 8  # every tensor starts 8-byte aligned, so it is viewed in place on arrival
        parts += [raw, torch.zeros(pad, dtype=torch.uint8)]
        offset += raw.numel() + pad
    blob = torch.cat(parts).numpy().tobytes() if parts else b""
    return RecordDict({META: ConfigRecord({JSON: json.dumps({**meta, "_layout": layout}), BLOB: blob})})


def unpack(content) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``pack``'s inverse: (meta, tensors on the CPU). A layout that does not fit the bytes (a reply
    from a broken or hostile node) raises ``ValueError`` naming what is wrong."""
    record = content[META]
    meta = json.loads(record[JSON])
    layout = meta.pop("_layout", [])
    raw = record.get(BLOB, b"")
    if not isinstance(raw, bytes):
        raise ValueError(f"its '{BLOB}' entry is {type(raw).__name__}, not bytes")
    blob = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)
    tensors = {}
    for key, dtype, shape, offset, size in layout:
        if dtype not in DTYPES or offset < 0 or size < 0 or offset + size > blob.numel():
            raise ValueError(f"tensor '{key}': dtype {dtype!r} or bytes {offset}..{offset + size} do not fit the message")
        t = blob[offset:offset + size]
        if offset % 8:  # not where pack puts it: copied to fresh (aligned) memory first
            t = t.clone()
        t = t.view(DTYPES[dtype])
        tensors[key] = t.reshape(shape)
    return meta, tensors


def wire_bytes(content) -> int:
    """Bytes of ``content`` as Flower serialises it for the wire: the sum of its deflated objects
    (the record dict and its records), which is what a SuperLink stores and
    forwards; transport framing (HTTP, TLS) is not included."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())


def to_bytes(obj: Any) -> torch.Tensor:
    """Nested client states as one uint8 tensor (``torch.save``), to travel in an ArrayRecord."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def from_bytes(t: torch.Tensor) -> Any:
    # weights_only: a node's reply is data from another machine, never code to run (as for checkpoints)
    return torch.load(io.BytesIO(t.numpy().tobytes()), weights_only=True)
