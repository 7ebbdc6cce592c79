"""What travels in a Flower Message: tensors as an ``ArrayRecord``, everything else as one JSON
string in a ``ConfigRecord``; and a message's real serialised size.

A tensor's key is its name in the message; numpy has no bfloat16, so a bfloat16 tensor travels as
its raw 16-bit pattern (int16) and is viewed back on arrival (the dtype is in the JSON part).
"""

from __future__ import annotations

import json
from typing import Any

import torch

META, ARRAYS = "meta", "arrays"


def pack(meta: dict[str, Any], tensors: dict[str, torch.Tensor]):
    """A ``RecordDict`` holding ``meta`` (JSON-serialisable) and ``tensors``."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    bf16 = sorted(k for k, t in tensors.items() if t.dtype == torch.bfloat16)
    arrays = {k: Array((t.view(torch.int16) if k in bf16 else t).detach().cpu().contiguous().numpy())
              for k, t in tensors.items()}
    meta = {**meta, "_bf16": bf16}
    return RecordDict({META: ConfigRecord({"json": json.dumps(meta)}), ARRAYS: ArrayRecord(arrays)})


def unpack(content) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``pack``'s inverse: (meta, tensors on the CPU)."""
    meta = json.loads(content[META]["json"])
    bf16 = set(meta.pop("_bf16", []))
    tensors = {}
    for key, array in content[ARRAYS].items():
        t = torch.from_numpy(array.numpy().copy())
        tensors[key] = t.view(torch.bfloat16) if key in bf16 else t
    return meta, tensors


def wire_bytes(content) -> int:
    """Bytes of ``content`` as Flower serialises it for the wire: the sum of its deflated objects
    (the record dict, each record, each array and its chunks), which is what a SuperLink stores and
    forwards; transport framing (HTTP, TLS) is not included."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())
