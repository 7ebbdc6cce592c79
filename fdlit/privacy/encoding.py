"""Upload encodings that share less than full logits, with exact byte counts.

A client's prediction on the public set (N x C logits) travels as one of:

* ``full``: the logits themselves, N x C numbers in the message dtype (what fdlit always sent);
* ``hard``: the predicted class ids, N integers (uint8 up to 256 classes, else int16);
* ``top_k``: the k largest probabilities of each row and their class ids (N x k numbers in the
  message dtype + N x k uint8/int16); the server spreads the rest of each row's mass evenly over
  the other C - k classes, so every decoded row is a distribution;
* ``quantised``: probabilities divided by their row maximum and rounded to ``bits``-bit integers,
  bit-packed (ceil(N * C * bits / 8) bytes as uint8), plus that row maximum (N numbers in the
  message dtype); decoded rows are renormalised to sum to 1.

The server turns every encoding back into logits the rules accept: log-probabilities, floored at
``LOG_FLOOR`` so that rules that average logits stay finite (softmax(log p) = p up to the floor).
"""

from __future__ import annotations

import math

import numpy as np
import torch

ENCODINGS = ("full", "hard", "top_k", "quantised")
# the message keys each encoding sends (what the server decodes; a method's other upload keys travel beside them)
MESSAGE_KEYS = {"full": ("logits",), "hard": ("labels",), "top_k": ("topk_values", "topk_indices"),
                "quantised": ("quantised", "quantised_scale")}
LOG_FLOOR = math.log(1e-12)


def id_dtype(num_classes: int) -> torch.dtype:
    """The smallest integer type that holds every class id."""
    return torch.uint8 if num_classes <= 256 else torch.int16


def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned integers < 2**bits -> their ``bits`` low bits, concatenated and packed into uint8."""
    v = values.reshape(-1).to(torch.int64).cpu().numpy()
    planes = ((v[:, None] >> np.arange(bits)) & 1).astype(np.uint8)
    return torch.from_numpy(np.packbits(planes.reshape(-1), bitorder="little"))


def unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    planes = np.unpackbits(packed.cpu().numpy(), count=count * bits, bitorder="little").reshape(count, bits)
    return torch.from_numpy((planes.astype(np.int64) << np.arange(bits)).sum(1))


def encode(logits: torch.Tensor, encoding: str, dtype: torch.dtype, top_k: int = 1, bits: int = 8
           ) -> dict[str, torch.Tensor]:
    """The messages one client sends for its N x C public logits."""
    n, c = logits.shape
    if encoding == "full":
        return {"logits": logits.to(dtype)}
    if encoding == "hard":
        return {"labels": logits.argmax(-1).to(id_dtype(c))}
    probs = logits.float().softmax(-1)
    if encoding == "top_k":
        values, indices = probs.topk(top_k, dim=-1)
        return {"topk_values": values.to(dtype), "topk_indices": indices.to(id_dtype(c))}
    if encoding == "quantised":
        scale = probs.amax(-1, keepdim=True)  # > 0: the largest of C probabilities is >= 1/C
        levels = 2**bits - 1
        q = torch.round(probs / scale * levels).clamp(0, levels)
        return {"quantised": pack_bits(q, bits).to(logits.device), "quantised_scale": scale.squeeze(-1).to(dtype)}
    raise ValueError(f"unknown encoding {encoding!r}")


def decode(messages: dict[str, torch.Tensor], encoding: str, num_classes: int, num_rows: int, bits: int = 8
           ) -> torch.Tensor:
    """Logits (N x C float32) the server hands to the rule, from what one client sent."""
    c = num_classes
    if encoding == "full":
        return messages["logits"]
    if encoding == "hard":
        ids = messages["labels"].long()
        probs = torch.nn.functional.one_hot(ids, c).float()
    elif encoding == "top_k":
        values, indices = messages["topk_values"].float(), messages["topk_indices"].long()
        k = values.shape[-1]
        rest = (1.0 - values.sum(-1, keepdim=True)).clamp_min(0.0) / max(c - k, 1)
        probs = torch.zeros(len(values), c, device=values.device) + (rest if k < c else 0.0)
        probs.scatter_(-1, indices, values)
    elif encoding == "quantised":
        scale = messages["quantised_scale"].float()
        q = unpack_bits(messages["quantised"], bits, num_rows * c).reshape(num_rows, c).to(scale.device)
        probs = q.float() / (2**bits - 1) * scale[:, None]
    else:
        raise ValueError(f"unknown encoding {encoding!r}")
    probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-30)
    return probs.clamp_min(math.exp(LOG_FLOOR)).log()


def encoded_bytes(num_rows: int, num_classes: int, encoding: str, dtype_bytes: int, top_k: int = 1, bits: int = 8
                  ) -> int:
    """Bytes one client's encoded upload takes on the wire (the ledger must count exactly this)."""
    n, c = num_rows, num_classes
    ids = 1 if c <= 256 else 2
    return {"full": n * c * dtype_bytes, "hard": n * ids, "top_k": n * top_k * (dtype_bytes + ids),
            "quantised": math.ceil(n * c * bits / 8) + n * dtype_bytes}[encoding]
