"""A node's half of secure aggregation: its clients' parties of fdlit.privacy.secure_sum.

Each client the node hosts is a party of its own (its key pairs, self-mask seed and the shares others
sent it live in this worker and nowhere else); the server's half is fdlit.deployment.secure_rounds,
which names the exchanges. The terms a client masks are those ``fit`` masks: the method's
``secure_summands`` of the client's release, or its clipped rows with its share of the central noise
(``UploadPrivacy.secure_terms``), computed here; the release itself never leaves the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fdlit.privacy.secure_sum import ADVERTISED_BYTES, Participant, info_of, mask_keys
from fdlit.privacy.secure_upload import SecureMaximum, flatten
from fdlit.privacy.wide_encoding import level_words

STAGES = ("levels", "")  # the shift exchange (used by rules that declare levels), then the terms


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
    """The protocol state of this node's clients in the current round: one aggregation per stage
    (``STAGES``: the shift exchange of a rule that declares levels, then the terms), each with its own
    keys, seeds and shares."""

    def __init__(self):
        self.start(-1, [])

    def start(self, r: int, clients: list[int]) -> tuple[list[int], torch.Tensor]:
        """Step 0, with the round's client step: key pairs for the node's clients in U1 (its sampled ones),
        one set per stage (the keys of every stage in one row per client)."""
        self.round = r
        self.people = {stage: {u: Participant.new(u) for u in clients} for stage in STAGES}
        self.kept: dict[int, Any] = {}  # arriving client -> its release (never sent in the clear)
        self.privacy, self.seed = None, 0
        self.u1: dict[str, list[int]] = {}
        self.t: dict[str, int] = {}
        self.advertised: dict[str, dict[int, bytes]] = {}
        self.masked: dict[str, set[int]] = {stage: set() for stage in STAGES}
        rows = [keys_tensor({u: p.advertised for u, p in self.people[stage].items()}, list(clients)) for stage in STAGES]
        return list(clients), torch.cat(rows, dim=1)

    def keep(self, ids: list[int], payloads: list, privacy: Any, seed: int = 0) -> list:
        """The arriving clients' releases, kept here (their terms are made when masking: they read the
        shift exchange's maximum and the number of clients); what goes up instead: each message
        without its arrays (the release's metrics only)."""
        missing = [i for i in ids if i not in self.people[""]]
        if missing:
            raise RuntimeError(f"secure aggregation: clients {missing} upload without having advertised keys")
        self.privacy, self.seed = privacy, seed
        for i, m in zip(ids, payloads, strict=True):
            self.kept[i] = m
        return [m.with_arrays({}) for m in payloads]

    def _check(self, meta: dict) -> str:
        if meta.get("round") != self.round:
            raise RuntimeError(f"secure aggregation: a request for round {meta.get('round')} in round {self.round}")
        stage = meta.get("stage", "")
        if stage not in STAGES:
            raise RuntimeError(f"secure aggregation: unknown stage {stage!r}")
        return stage

    def share(self, meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
        """Step 1: every advertised key; each of the node's clients' shares, encrypted for each other client."""
        stage = self._check(meta)
        people, info = self.people[stage], info_of(self.round, stage)
        u1 = self.u1[stage] = [int(v) for v in meta["u1"]]
        t = self.t[stage] = int(meta["t"])
        advertised = self.advertised[stage] = keys_of(u1, tensors["keys"])
        if any(advertised[u] != p.advertised for u, p in people.items() if u in advertised):
            raise RuntimeError("secure aggregation: the server relayed another key than a client of this node made")
        senders = [u for u in people if u in advertised]
        rows: list[torch.Tensor] = []
        if len(u1) < 2:  # nobody to share with
            return {"senders": senders}, {}
        for u in senders:
            sealed = people[u].share(u1, t, advertised, info)
            rows.append(byte_tensor(b"".join(sealed[v] for v in u1 if v != u)))
        out = {"ciphertexts": torch.stack(rows).reshape(len(senders), len(u1) - 1, -1)} if rows else {}
        return {"senders": senders}, out

    def _vector(self, stage: str, u: int, maximum: torch.Tensor | None) -> tuple[np.ndarray, list]:
        """Client u's vector of this stage: its levels' thermometer code, or its terms in fixed point."""
        m, n = self.kept[u], len(self.u1[stage])
        if stage == "levels":
            count = self.privacy.secure_levels
            level = self.privacy.secure_level(m, u)
            return level_words(level.cpu().numpy(), count), [["levels", [len(level)], float(count), 0, count]]
        top = None if maximum is None else SecureMaximum(maximum.long(), ())
        vector, layout = flatten(self.privacy.secure_terms(m, u, self.round, n, self.seed, top), n)
        return vector, [[name, list(shape), b, bits, limbs] for name, shape, b, bits, limbs in layout]

    def mask(self, meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
        """Step 2: the shares routed to the node's clients (``pairs``: sender, recipient); the arriving
        clients' vectors (terms in fixed point for n = |U1|, reading the shift exchange's ``maximum``
        where sent; or the levels' code), masked against every client that shared (``shared``)."""
        stage = self._check(meta)
        people, info, advertised = self.people[stage], info_of(self.round, stage), self.advertised[stage]
        shared = [int(v) for v in meta["shared"]]
        if len(shared) < self.t[stage] or not set(shared) <= set(self.u1[stage]):
            raise RuntimeError(f"secure aggregation: {len(shared)} clients shared, {self.t[stage]} needed, all of U1")
        by_recipient: dict[int, dict[int, bytes]] = {}
        for (u, v), c in zip(meta["pairs"], tensors.get("ciphertexts", []), strict=True):
            by_recipient.setdefault(int(v), {})[int(u)] = bytes(c.numpy().tobytes())
        for v, sealed in by_recipient.items():
            people[v].receive(sealed, advertised, info)
        keys = mask_keys({v: advertised[v] for v in shared})
        ids, rows, layout = [], [], []
        for u in sorted(self.kept):
            if u in shared:
                vector, layout = self._vector(stage, u, tensors.get("maximum"))
                rows.append(torch.from_numpy(people[u].mask(vector, keys, info).view(np.int64)))
                ids.append(u)
        self.masked[stage] = set(ids)
        out = {"masked": torch.stack(rows)} if rows else {}
        return {"masked_ids": ids, "layout": layout}, out

    def unmask(self, meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
        """Step 3: each surviving client's shares of the survivors' self-mask seeds and of the dropped
        clients' mask keys; never the mask key of a client of this node that sent its masked vector."""
        stage = self._check(meta)
        people = self.people[stage]
        survivors, dropped = [int(v) for v in meta["survivors"]], [int(v) for v in meta["dropped"]]
        if self.masked[stage] & set(dropped):
            raise RuntimeError(f"secure aggregation: clients {sorted(self.masked[stage] & set(dropped))} sent their "
                               "masked terms and are named dropped: their mask keys are not revealed")
        revealed = {str(h): {str(v): [x, f"{y:x}"] for v, (x, y) in people[h].reveal(survivors, dropped).items()}
                    for h in survivors if h in people and h in self.masked[stage]}
        self.people[stage] = {}  # this aggregation's secrets are spent
        return {"revealed": revealed}, {}
