"""A node's half of secure aggregation: its clients' parties of fdlit.privacy.secure_sum.

Each client the node hosts is a party of its own (its key pairs, self-mask seed and the shares others
sent it live in this worker and nowhere else); the server's half is fdlit.deployment.secure_rounds,
which names the exchanges. The terms a client masks are those ``fit`` masks: the method's
``secure_summands`` of the client's release (``UploadPrivacy.secure_terms``), computed here; the
release itself never leaves the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fdlit.privacy.secure_sum import ADVERTISED_BYTES, Participant, info_of, mask_keys
from fdlit.privacy.secure_upload import flatten


def byte_tensor(raw: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())


def keys_tensor(advertised: dict[int, bytes], ids: list[int]) -> torch.Tensor:
    """The advertised keys of ``ids``, one row of bytes each."""
    return byte_tensor(b"".join(advertised[i] for i in ids)).reshape(len(ids), ADVERTISED_BYTES)


def keys_of(ids: list[int], tensor: torch.Tensor) -> dict[int, bytes]:
    if tuple(tensor.shape) != (len(ids), ADVERTISED_BYTES):
        raise ValueError(f"keys of shape {tuple(tensor.shape)} for {len(ids)} clients")
    return {i: bytes(row.numpy().tobytes()) for i, row in zip(ids, tensor, strict=True)}


class NodeSecureAggregation:
    """The protocol state of this node's clients in the current round."""

    def __init__(self):
        self.start(-1, [])

    def start(self, r: int, clients: list[int]) -> tuple[list[int], torch.Tensor]:
        """Step 0, with the round's client step: key pairs for the node's clients in U1 (its sampled ones)."""
        self.round, self.info = r, info_of(r)
        self.people = {u: Participant.new(u) for u in clients}
        self.terms: dict[int, dict] = {}  # arriving client -> its terms of the sum (never sent in the clear)
        self.u1: list[int] = []
        self.masked: set[int] = set()
        return list(clients), keys_tensor({u: p.advertised for u, p in self.people.items()}, list(clients))

    def keep(self, ids: list[int], payloads: list, privacy: Any) -> list:
        """The arriving clients' terms, kept here; what goes up instead: each message without its arrays
        (the release's metrics only)."""
        missing = [i for i in ids if i not in self.people]
        if missing:
            raise RuntimeError(f"secure aggregation: clients {missing} upload without having advertised keys")
        for i, m in zip(ids, payloads, strict=True):
            self.terms[i] = privacy.secure_terms(m, i)
        return [m.with_arrays({}) for m in payloads]

    def _check(self, meta: dict) -> None:
        if meta.get("round") != self.round:
            raise RuntimeError(f"secure aggregation: a request for round {meta.get('round')} in round {self.round}")

    def share(self, meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
        """Step 1: every advertised key; each of the node's clients' shares, encrypted for each other client."""
        self._check(meta)
        self.u1, self.t = [int(v) for v in meta["u1"]], int(meta["t"])
        self.advertised = keys_of(self.u1, tensors["keys"])
        if any(self.advertised[u] != p.advertised for u, p in self.people.items() if u in self.advertised):
            raise RuntimeError("secure aggregation: the server relayed another key than a client of this node made")
        senders = [u for u in self.people if u in self.advertised]
        rows: list[torch.Tensor] = []
        if len(self.u1) < 2:  # nobody to share with
            return {"senders": senders}, {}
        for u in senders:
            sealed = self.people[u].share(self.u1, self.t, self.advertised, self.info)
            rows.append(byte_tensor(b"".join(sealed[v] for v in self.u1 if v != u)))
        out = {"ciphertexts": torch.stack(rows).reshape(len(senders), len(self.u1) - 1, -1)} if rows else {}
        return {"senders": senders}, out

    def mask(self, meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
        """Step 2: the shares routed to the node's clients (``pairs``: sender, recipient); the arriving
        clients' terms in fixed point (n = |U1|), masked against every client that shared (``shared``)."""
        self._check(meta)
        shared = [int(v) for v in meta["shared"]]
        if len(shared) < self.t or not set(shared) <= set(self.u1):
            raise RuntimeError(f"secure aggregation: {len(shared)} clients shared, {self.t} needed, all of U1")
        by_recipient: dict[int, dict[int, bytes]] = {}
        for (u, v), c in zip(meta["pairs"], tensors.get("ciphertexts", []), strict=True):
            by_recipient.setdefault(int(v), {})[int(u)] = bytes(c.numpy().tobytes())
        for v, sealed in by_recipient.items():
            self.people[v].receive(sealed, self.advertised, self.info)
        keys = mask_keys({v: self.advertised[v] for v in shared})
        ids, rows, layout = [], [], []
        for u in sorted(self.terms):
            if u in shared:
                vector, layout = flatten(self.terms[u], len(self.u1))
                rows.append(torch.from_numpy(self.people[u].mask(vector, keys, self.info).view(np.int64)))
                ids.append(u)
        self.masked = set(ids)
        out = {"masked": torch.stack(rows)} if rows else {}
        return {"masked_ids": ids, "layout": [[n, list(s), b, bits] for n, s, b, bits in layout]}, out

    def unmask(self, meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
        """Step 3: each surviving client's shares of the survivors' self-mask seeds and of the dropped
        clients' mask keys; never the mask key of a client of this node that sent its masked terms."""
        self._check(meta)
        survivors, dropped = [int(v) for v in meta["survivors"]], [int(v) for v in meta["dropped"]]
        if self.masked & set(dropped):
            raise RuntimeError(f"secure aggregation: clients {sorted(self.masked & set(dropped))} sent their masked "
                               "terms and are named dropped: their mask keys are not revealed")
        revealed = {str(h): {str(v): [x, f"{y:x}"] for v, (x, y) in self.people[h].reveal(survivors, dropped).items()}
                    for h in survivors if h in self.people and h in self.masked}
        self.people = {}  # this aggregation's secrets are spent
        return {"revealed": revealed}, {}
