"""A node's reply checked before the round uses it, and its messages decoded.

A node is another party: its reply may be broken (a bug, a diverged client, a hostile operator).
A reply that is not numerically or structurally what the request asked for makes that node a
dropout of the round (the FlowerExecutor names it) instead of ending the federation or reaching the
server's aggregation. Each check returns None for a valid reply, else why it is not.
"""

from __future__ import annotations

import math

import torch

from fdlit.messages import Message
from fdlit.privacy.encoding import MESSAGE_KEYS

# arrays with one row per public row (the quantised codes are packed bits: no row structure)
ENCODED = {k for keys in MESSAGE_KEYS.values() for k in keys} - {"quantised"}


def check_losses(meta: dict, clients: int) -> str | None:
    """One finite mean loss per trained client."""
    losses = meta.get("losses")
    if not isinstance(losses, list) or len(losses) != clients:
        return f"{len(losses) if isinstance(losses, list) else 'no'} losses for {clients} clients"
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in losses):
        return "a non-finite training loss"
    return None


def row_masks(uploads) -> tuple[str, ...]:
    """The names of a method's declared uploads that say which public rows its other arrays carry: a
    boolean array with one entry per public row (Selective-FD's ``mask``, SCARLET's ``requested``)."""
    return tuple(u.name for u in uploads if u.dtype == torch.bool and u.shape == ("N",))


def check_step(meta: dict, tensors: dict[str, torch.Tensor], trained: int, uploading: int,
               expect: tuple[int, int] | None, masks: tuple[str, ...] = ("mask",)) -> str | None:
    """The client step's reply: losses of the ``trained`` clients, finite predictions and uploads, one
    message per ``uploading`` client whose arrays are all there, and, for predictions (``expect``:
    public rows, classes), one row per public row, or per row its row mask (``masks``: the first of
    these names an upload carries) keeps."""
    if why := check_losses(meta, trained):
        return why
    for k, x in tensors.items():
        if k.startswith(("u", "pred/")) and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            return f"non-finite numbers in '{k}'"
    if not uploading:
        return None
    upload = meta.get("upload")
    if not isinstance(upload, dict) or len(upload.get("keys", [])) != uploading or \
            len(upload.get("typed", [])) != uploading:
        return "no upload for its arriving clients"
    missing = [f"u{pos}/{k}" for pos, keys in enumerate(upload["keys"]) for k in keys if f"u{pos}/{k}" not in tensors]
    if missing:
        return f"arrays {missing[:3]} named but not sent"
    if expect is not None:
        public_rows, classes = expect
        for k, x in tensors.items():
            pos, _, key = k.partition("/")
            if not k.startswith("u"):
                continue
            # an upload with a mask over the public rows (Selective-FD, EdgeFD, SCARLET) sends only the kept ones
            name = next((m for m in (*masks, "mask") if f"{pos}/{m}" in tensors), "mask")
            mask = tensors.get(f"{pos}/{name}")
            if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != (public_rows,)):
                return f"'{name}' of shape {tuple(mask.shape)} ({mask.dtype}) for {public_rows} public rows"
            rows = int(mask.sum()) if mask is not None else public_rows
            labels = tensors.get(f"{pos}/labels")  # hard labels instead of logits (then 0 x C logits)
            if labels is not None and (labels.dim() != 1 or len(labels) != rows):
                return f"'labels' of shape {tuple(labels.shape)} for {rows} public rows"
            if labels is not None and key == "logits" and tuple(x.shape) == (0, classes):
                continue
            if key in ENCODED and (x.dim() == 0 or len(x) != rows):
                return f"'{key}' of shape {tuple(x.shape)} for {rows} public rows"
            if key == "logits" and tuple(x.shape) != (rows, classes):
                return f"logits of shape {tuple(x.shape)}, expected {(rows, classes)}"
    return None


def messages_of(upload: dict | None, tensors: dict[str, torch.Tensor], device) -> list[Message]:
    """The typed messages of a reply: arrays ``u<pos>/<key>``; metrics, config and sensitivity in its JSON part."""
    if not upload:
        return []
    # copies: a reply's arrays are views of its one buffer, and a message may be kept (an asynchronous
    # cache, saved with the run: torch.save refuses views of one storage as different types)
    return [Message({k: tensors[f"u{pos}/{k}"].to(device, copy=True) for k in keys}, **typed)
            for pos, (keys, typed) in enumerate(zip(upload["keys"], upload["typed"], strict=True))]
