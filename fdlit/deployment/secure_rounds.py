"""Secure aggregation over a deployment's messages: the server's half of fdlit.privacy.secure_sum, with
the clients' half on the nodes (fdlit.deployment.secure_node), so the ServerApp never holds a client's
upload, masked or not, only the sum.

The round's client step carries the key advertisement: each node makes key pairs for its clients in U1
(the round's sampled clients it hosts), and each arriving client's terms of the sum (its method's
``secure_summands`` of its release) stay on the node instead of the upload. Three exchanges follow,
each one Message per node:

A rule that declares levels (a softmax over the clients, fdlit.privacy.secure_softmax) runs the three
exchanges twice: first for the levels' codes (stage ``levels``, its own keys), then for the terms,
with the per-sample maximum sent down with ``secagg_mask``.

* ``secagg_share``: every advertised key down; each client's shares, each encrypted for one other
  client, up;
* ``secagg_mask``: the ciphertexts each node's clients were sent down (the server routes them and
  cannot read them); each arriving client's masked terms up (fixed point for n = |U1| clients), with
  the layout of its terms;
* ``secagg_unmask``: the survivors (clients whose masked terms arrived) and the dropped down; each
  survivor's shares of the survivors' self-mask seeds and of the dropped clients' mask keys up.

A node that does not answer one of them in time is lost, as in any request: its clients that shared
but sent no masked terms are dropouts after sharing, whose masks the survivors' shares remove; a node
lost before sharing leaves its clients out of the aggregation. The server follows the protocol
(semi-honest, as in ``fit``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fdlit.deployment.secure_node import STAGES, keys_of, keys_tensor
from fdlit.privacy.secure_sum import ADVERTISED_BYTES, EXCHANGES, count_messages, info_of, mask_keys, threshold, unmask
from fdlit.privacy.secure_upload import SecureMaximum, SecureSums, decoded_sums, expected_bits, ledger_counter
from fdlit.privacy.wide_encoding import maximum_level

Request = Callable[..., dict]  # request(op, {node: (meta, tensors)}, tolerate=True) -> {node: (meta, tensors)}


class SecureRounds:
    """The server's side of each round's aggregations: ``advertised`` from the client step's replies
    (one key set per stage, fdlit.deployment.secure_node), then ``secure_sum`` (``ClientExecutor.secure_sum``)
    over ``request`` for each stage the rule needs; ``node_of``: client -> node."""

    def __init__(self, request: Request, node_of: Callable[[], dict[int, int]]):
        self.request, self.node_of = request, node_of
        self.round, self.advertised = -1, {stage: {} for stage in STAGES}
        self.device = torch.device("cpu")

    def step_meta(self, r: int, hosted_sampled: list[int]) -> dict:
        """What a node's client-step request carries: its clients in U1, to make their keys."""
        self.round, self.advertised = r, {stage: {} for stage in STAGES}
        return {"round": r, "clients": hosted_sampled}

    def keep_keys(self, replies: dict) -> None:
        """The keys the nodes' clients advertised in the client step (valid replies only): each row holds
        one client's keys of every stage."""
        for node, (meta, tensors) in replies.items():
            ids = [int(i) for i in meta.get("secagg_ids", [])]
            hosted = [i for i in ids if self.node_of().get(i) == node]  # a node speaks for its own clients only
            rows = tensors.get("secagg/keys")
            if not ids or hosted != ids or rows is None or tuple(rows.shape) != (len(ids), ADVERTISED_BYTES * len(STAGES)):
                continue
            for k, stage in enumerate(STAGES):
                self.advertised[stage].update(keys_of(ids, rows[:, k * ADVERTISED_BYTES:(k + 1) * ADVERTISED_BYTES]))

    def _by_node(self, clients) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for c in clients:
            out.setdefault(self.node_of()[c], []).append(c)
        return out

    def secure_sum(self, r: int, sampled: Sequence[int], clients: Sequence[int], fraction: float,
                   send: Callable, stage: str = "", maximum: SecureMaximum | None = None
                   ) -> tuple[SecureSums | SecureMaximum | None, dict[str, float]]:
        """The arriving ``clients``' vectors of ``stage`` summed over the protocol among the clients that
        advertised keys (U1: the ``sampled`` clients whose node answered the client step): the terms
        (reading the shift exchange's ``maximum`` where given), or with ``stage="levels"`` the levels'
        codes, whose sum gives each entry's maximum level; ``send`` counts each message in the ledger as
        ``fit`` does (fdlit.privacy.secure_sum.count_messages)."""
        start = time.perf_counter()
        if r != self.round:
            raise RuntimeError(f"secure aggregation of round {r} without its keys (the client step was round {self.round})")
        advertised = self.advertised[stage]
        u1 = sorted(u for u in advertised if u in set(sampled) | set(clients))
        t, n = threshold(len(u1), fraction), len(u1)
        stats = {"secagg/clients": float(n), "secagg/threshold": float(t), "secagg/extra_exchanges": float(EXCHANGES)}
        keys = keys_tensor(advertised, u1)
        # 1. shares: every key down, each client's ciphertexts (one per other client of U1) up
        replies = self.request("secagg_share", {node: ({"round": r, "stage": stage, "u1": u1, "t": t}, {"keys": keys})
                                                for node in self._by_node(u1)}, tolerate=True)
        sealed: dict[tuple[int, int], torch.Tensor] = {}
        shared_by: set[int] = set()
        for node, (meta, tensors) in replies.items():
            senders = [int(u) for u in meta.get("senders", []) if self.node_of().get(int(u)) == node]
            rows = tensors.get("ciphertexts")
            if n > 1 and (rows is None or tuple(rows.shape[:2]) != (len(senders), n - 1)):
                continue  # not one ciphertext per other client: that node's clients did not share
            shared_by.update(senders)
            for u, row in zip(senders, rows if n > 1 else [], strict=False):
                sealed.update({(u, v): c for v, c in zip([v for v in u1 if v != u], row, strict=True)})
        shared = sorted(shared_by)
        # 2. masked vectors: each node's clients' ciphertexts (and the maximum) down, its arriving clients' up
        masked, layout = {}, None
        if len(shared) >= t:
            per_node = {}
            for node, hosted in self._by_node(shared).items():
                pairs = [[u, v] for (u, v) in sealed if v in hosted and u in shared]
                tensors = {"ciphertexts": torch.stack([sealed[(u, v)] for u, v in pairs])} if pairs else {}
                if maximum is not None:
                    tensors["maximum"] = maximum.maximum.to(torch.int16)
                per_node[node] = ({"round": r, "stage": stage, "shared": shared, "pairs": pairs}, tensors)
            for node, (meta, tensors) in self.request("secagg_mask", per_node, tolerate=True).items():
                ids = [int(u) for u in meta.get("masked_ids", [])]
                if not ids or any(self.node_of().get(u) != node or u not in clients for u in ids):
                    continue
                node_layout = [(name, tuple(shape), float(b), int(bits), int(limbs))
                               for name, shape, b, bits, limbs in meta["layout"]]
                size = sum(int(np.prod(s)) * limbs for _, s, _, _, limbs in node_layout)
                if layout not in (None, node_layout) or "masked" not in tensors or tensors["masked"].shape != (
                        len(ids), size) or not well_formed(node_layout, stage, n):
                    continue  # vectors the others' would not sum with (or could wrap around): its clients drop out
                layout = node_layout
                masked.update({u: y.numpy().view(np.uint64) for u, y in zip(ids, tensors["masked"], strict=True)})
        survivors = sorted(masked)
        dropped = [v for v in shared if v not in masked]
        stats["secagg/dropped_after_sharing"] = float(n - len(survivors))
        stats["secagg/survivors"] = float(len(survivors))
        # 3. unmasking: the survivors' shares of the survivors' seeds and the dropped clients' keys
        total = None
        if len(survivors) >= t:
            asked = {node: ({"round": r, "stage": stage, "survivors": survivors, "dropped": dropped}, {})
                     for node in self._by_node(survivors)}
            revealed = {}
            for node, (meta, _) in self.request("secagg_unmask", asked, tolerate=True).items():
                for h, shares in meta.get("revealed", {}).items():
                    if self.node_of().get(int(h)) == node and int(h) in masked:
                        revealed[int(h)] = {int(v): (int(x), int(y, 16)) for v, (x, y) in shares.items()}
            try:
                total = unmask(masked, revealed, mask_keys({v: advertised[v] for v in shared}), t, info_of(r, stage))
            except ValueError:  # fewer than t survivors answered: no aggregate
                total = None
        count_messages(ledger_counter(r, send), u1, masked, survivors if total is not None else [])
        stats.update({"secagg/failed": float(total is None), "time/secagg_s": time.perf_counter() - start})
        self.advertised[stage] = {}
        if total is None:
            return None, stats
        if stage == "levels":
            count = layout[0][4]
            return SecureMaximum(torch.from_numpy(maximum_level(total, count)), tuple(survivors)), stats
        return decoded_sums(total, layout, n, survivors, self.device, stats)


def well_formed(layout: list, stage: str, clients: int) -> bool:
    """A node's layout is the one its stage sends: the levels' code alone, or terms whose scale keeps
    the sum of ``clients`` clients from wrapping around."""
    if stage == "levels":
        return len(layout) == 1 and layout[0][0] == "levels" and layout[0][3] == 0 and layout[0][4] >= 1
    return all(bits == expected_bits(b, clients, limbs) and limbs >= 1 for _, _, b, bits, limbs in layout)
