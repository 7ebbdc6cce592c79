"""A round's receive carried by the clients' next request: parameter exchange in one exchange a round.

In a parameter exchange (FedAvg and its relatives) a round's last client work is every client
loading the server's broadcast (the client part's ``receive``), then the round's evaluation. Sent on
its own that is a second exchange a round. Instead the FlowerExecutor keeps the receive until the
next request to the nodes, which is the next round's client step: a node loads the broadcast,
measures its clients on the evaluation sets (which samples each predicts right), saves or sends their
states when the round ends in a checkpoint, and only then trains the next round. The loop reads that
round's evaluation right after the step came back and closes the round: the loop hands this executor
the round's closing (``when_evaluated``) and it runs it, inside ``_carried_evaluation``, when the loop
asks for the rounds that wait (``close_waiting``: after the next client step, and before the run
stops, when the last round's receive goes on its own, a closing request). Any other request sends a waiting receive
on its own first, so nodes always see the requests in the order of ``fit``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fdlit.deployment.replies import check_losses
from fdlit.messages import Message


class CarriedReceive:
    """Mixed into :class:`~fdlit.deployment.executor.FlowerExecutor` (its link, groups and references)."""

    def _carry_reset(self) -> None:
        self._pending: dict[int, tuple[list[dict], dict[str, torch.Tensor]]] = {}  # node -> (receives, tensors)
        self._pending_round = 0  # the round whose receive waits (0: the method's set-up)
        self._pending_states: dict = {}  # what the nodes do with their clients' states after it (a checkpoint)
        self._open = False  # a round whose evaluation after its receive the loop has not read yet
        self._carried: dict[str, dict] = {}  # the clients after the carried receive: cache, states, logged
        self._in_carried = False
        self._reported: dict | None = None  # the open round's costs, taken before the request that carried it
        self._waiting: tuple | None = None  # the open round's (evaluate, close), run by close_waiting

    def when_evaluated(self, evaluate, close):
        """Close the round now, or, when its receive waits for the clients' next request, keep its
        closing for ``close_waiting`` (fdlit.execution.steps.when_evaluated)."""
        if not self._pending:
            return close(evaluate())
        self._waiting = (evaluate, close)
        return None

    def close_waiting(self) -> None:
        """The waiting round's evaluation, read as its clients were right after its receive, then its closing."""
        if self._waiting is None:
            return
        (evaluate, close), self._waiting = self._waiting, None
        with self._carried_evaluation():
            close(evaluate())

    def request(self, op: str, per_node: dict, tolerate: bool = False, timeout_s: float | None = None,
                on_reply=None) -> dict:
        if self._pending and op != "step":  # nodes see the requests in fit's order: the receive first
            self._send_carried_alone()
        return self.link.request(op, per_node, self._token.live(), tolerate, timeout_s, on_reply)

    def _queue_receive(self, info, clients, received) -> list[Message]:
        """Keep the receive (every client loads ``received``) for the nodes' next request."""
        for node, idx in self._groups(clients).items():
            entries, out = self._pending.setdefault(node, ([], {}))
            entries.append({"ids": [clients[j].client_id for j in idx], "round": info.round,
                            "clients": list(info.clients), "public_index": self._ref(info.public_index, node, out),
                            "received": {k: self._ref(v, node, out) for k, v in received.items()}})
        self._pending_round = info.round
        # the set-up's receive (round 0) is not evaluated; a round's is, and ends in its checkpoint
        self._open = info.round > 0
        self._pending_states = self._states_ask() if self._open else {}
        return [Message() for _ in clients]

    def _carry_into(self, per_node: dict) -> tuple[dict[int, list[int]], list, bool]:
        """Put the waiting receive in front of each node's request (a node without one gets a request
        that trains nothing); which clients of each node received, the sets measured after it, and
        whether this closes an evaluated round."""
        if not self._pending:
            return {}, [], False
        measured = self._pending_round > 0
        inputs = self._evaluated_sets() if measured else []
        carried = {}
        for node, (entries, out) in self._pending.items():
            if node in self.lost_nodes:
                continue
            meta, tensors = per_node.get(node) or ({"round": self._pending_round, "ids": [], "datasets": [],
                                                    "epochs": 0, "batch_size": 0, "then_measure": []}, {})
            tensors = {**tensors, **out}
            per_node[node] = ({**meta, "receive": entries, "receive_measure": self._measure(inputs, node, tensors),
                               "receive_states": self._pending_states}, tensors)
            carried[node] = [i for e in entries for i in e["ids"]]
        self._pending = {}
        return carried, inputs, measured

    def _took_carried(self, replies: dict, carried: dict[int, list[int]], inputs: list, measured: bool) -> None:
        """The carried receive's part of the replies (before the request's own part is taken): what the
        loop reads in ``_carried_evaluation``; it is also the clients' latest for those not trained since."""
        from fdlit.deployment.wire import from_bytes

        cache: dict[tuple[int, int], torch.Tensor] = {}
        states: dict[int, Any] = {}
        # what the clients logged before the receive belongs to the round it closes (round 0: round 1)
        logged = self.__dict__.pop("_logged", {}) if measured else self.__dict__.setdefault("_logged", {})
        for node, (meta, tensors) in replies.items():
            ids = carried.get(node)
            if ids is None:
                continue
            for k, (x, _) in enumerate(inputs):
                for cid, z in zip(ids, tensors[f"recv/{k}"], strict=True):
                    cache[(id(x), cid)] = z
            if "receive_states" in tensors:
                states.update(zip(ids, from_bytes(tensors["receive_states"]), strict=True))
            if "receive_saved" in meta:  # [round, client ids]: saved on the node
                self._saved.update(dict.fromkeys(meta["receive_saved"][1], int(meta["receive_saved"][0])))
            for name, values in meta.get("receive_logged", {}).items():
                logged.setdefault(name, []).extend(values)
        received = {cid for ids in carried.values() for cid in ids}
        self._cache = {k: v for k, v in self._cache.items() if k[1] not in received} | cache
        self._states = {i: s for i, s in self._states.items() if i not in received} | states
        if measured:
            self._carried = {"cache": cache, "states": states, "logged": logged}

    def _send_carried_alone(self) -> None:
        per_node: dict = {}
        carried, inputs, measured = self._carry_into(per_node)
        replies = self.request("step", per_node, tolerate=True)
        self._took_carried(self._valid(replies, lambda node, meta, tensors: check_losses(meta, 0)), carried, inputs,
                           measured)

    def _report_open_round(self) -> None:
        """Before the request that carries an evaluated round's receive: that round's costs end here."""
        if self._pending and self._open and self._reported is None:
            self._reported = self._round_costs()

    @contextmanager
    def _carried_evaluation(self) -> Iterator[None]:
        if self._pending:  # no request carried it (the last round): the closing request
            self._send_carried_alone()
        kept = (self._cache, self._states, self.__dict__.pop("_logged", {}))
        carried = self._carried
        self._cache, self._states = dict(carried.get("cache", {})), dict(carried.get("states", {}))
        self._logged = carried.get("logged", {})
        self._in_carried = True
        try:
            yield
        finally:
            self._cache, self._states, self._logged = kept
            self._carried, self._open, self._in_carried = {}, False, False
