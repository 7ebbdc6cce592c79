"""The FlowerExecutor's requests outside a round's exchanges: a phase, a prediction or a method's
hook run on the nodes on their own, and the clients' states fetched or pushed.

A round of a shipped protocol needs none of them (``client_step`` and ``distil`` carry it); they serve
a method's set-up and receive hooks, a protocol that trains or predicts phase by phase, checkpoints
that fall between the rounds' last replies, and a node that takes over a lost one's clients.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from fdlit.deployment.replies import messages_of
from fdlit.execution.steps import report
from fdlit.messages import Message


class NodeRequests:
    """Mixed into :class:`~fdlit.deployment.executor.FlowerExecutor` (its node link, groups and references)."""

    def train(self, clients, phase, datasets, epochs, batch_size):
        if phase == "private":  # a round begins: nodes that replace lost ones join here
            self._rejoin()
        self._prune()
        groups = self._groups(clients)
        inputs = self._evaluated_sets()
        per_node = {}
        for node, idx in groups.items():
            out: dict[str, torch.Tensor] = {}
            refs = [[self._ref(datasets[j][0], node, out), self._ref(datasets[j][1], node, out)] for j in idx]
            per_node[node] = ({"ids": [clients[j].client_id for j in idx], "phase": phase, "datasets": refs,
                               "epochs": epochs, "batch_size": batch_size,
                               "then_measure": self._measure(inputs, node, out)}, out)
        replies = self.request("train", per_node, tolerate=True)
        losses = self._losses(len(clients), replies, groups)
        self._changed(clients, range(len(clients)), replies, groups, inputs)
        report(self, phase, len(clients), len(clients))
        return losses

    def predict(self, clients, x):
        self._prune()
        groups = self._groups(clients)
        per_node, refs = {}, {}
        for node, idx in groups.items():
            out: dict[str, torch.Tensor] = {}
            refs[node] = self._ref(x, node, out)
            per_node[node] = ({"ids": [clients[j].client_id for j in idx], "x": refs[node]}, out)
        rows: list[torch.Tensor | None] = [None] * len(clients)
        for node, (_, tensors) in self.request("predict", per_node, tolerate=True).items():
            for j, z in zip(groups[node], tensors["logits"], strict=True):
                rows[j] = z
        shape = next(z.shape for z in rows if z is not None)
        # unreachable clients: NaN logits (evaluation reports no accuracy for them)
        result = torch.stack([torch.full(shape, math.nan) if z is None else z for z in rows]).to(x.device)
        return result

    def client_hook(self, hook, part, info, clients, client_data, received, public_logits=None):
        if public_logits is not None:  # the nodes make the public logits themselves (``upload``)
            raise NotImplementedError("FlowerExecutor.client_hook: public logits come from the nodes' upload step")
        if hook == "receive" and self.may_carry_receive:  # goes with the nodes' next request (fdlit.deployment.carried)
            return self._queue_receive(info, clients, received)
        return self._on_nodes(hook, info, clients, received)

    def _on_nodes(self, hook, info, clients, received):
        self._prune()
        groups = self._groups(clients)
        inputs = self._evaluated_sets()  # a hook may change the clients (e.g. loading the global model)
        per_node = {}
        for node, idx in groups.items():
            out: dict[str, torch.Tensor] = {}
            meta = {"then_measure": self._measure(inputs, node, out), "hook": hook,
                    "ids": [clients[j].client_id for j in idx], "round": info.round, "clients": list(info.clients),
                    "public_index": self._ref(info.public_index, node, out),
                    "received": {k: self._ref(v, node, out) for k, v in received.items()},
                    **(self._states_ask() if hook == "receive" else {})}  # the round's last exchange
            per_node[node] = (meta, out)
        payloads: list[Message] = [Message() for _ in clients]
        # a node lost in a round's exchange: its clients are dropouts; set-up needs every node
        replies = self.request("hook", per_node, tolerate=hook != "setup")
        for node, (meta, tensors) in replies.items():
            for j, m in zip(groups[node], messages_of(meta.get("upload"), tensors, self.device), strict=True):
                payloads[j] = m
        self._changed(clients, range(len(clients)), replies, groups, inputs)
        self._keep_states(replies)
        return payloads

    def fetch_states(self, clients):
        from fdlit.deployment.wire import from_bytes

        if not self.node_ids:
            return [c.client_state() for c in clients]
        if self._in_carried:  # the clients as they were after the carried receive: never asked for now
            for c in clients:
                if c.client_id in self._states:
                    c.load_client_state(self._states[c.client_id])
            return [c.client_state() for c in clients]
        if all(c.client_id in self._states for c in clients):  # sent with the round's last reply
            for c in clients:
                c.load_client_state(self._states[c.client_id])
            return [self._states[c.client_id] for c in clients]
        groups = self._groups(clients)
        replies = self.request("get_states", {n: ({"ids": [clients[j].client_id for j in idx]}, {})
                                              for n, idx in groups.items()}, tolerate=True)
        states: list[Any] = [None] * len(clients)
        for node, (_, tensors) in replies.items():
            for j, state in zip(groups[node], from_bytes(tensors["states"]), strict=True):
                clients[j].load_client_state(state)
                states[j] = state
        # an unreachable client: the last state the server fetched of it
        return [c.client_state() if s is None else s for c, s in zip(clients, states, strict=True)]

    def push_states(self, clients) -> None:
        from fdlit.deployment.wire import to_bytes

        groups = self._groups(clients)
        pushed = {c.client_id for c in clients}
        self._cache = {k: v for k, v in self._cache.items() if k[1] not in pushed}
        self._states = {i: v for i, v in self._states.items() if i not in pushed}
        self.request("set_states", {n: ({"ids": [clients[j].client_id for j in idx]},
                                        {"states": to_bytes([clients[j].client_state() for j in idx])})
                                    for n, idx in groups.items()})

    # ------------------------------------------------------------------ node-side checkpoints
    def checkpoint_states(self, clients):
        """For the run's checkpoint: the clients' states where they came up (the last round), else a stub
        per client naming the round its node saved (fdlit.deployment.node_checkpoints); a client whose
        node never saved one: the server's copy."""
        from fdlit.deployment.node_checkpoints import stub

        if not self.node_ids or all(c.client_id in self._states for c in clients):
            return self.fetch_states(clients)
        return [stub(self.node_key, self._saved[c.client_id]) if c.client_id in self._saved else c.client_state()
                for c in clients]

    def load_states(self, clients, states) -> None:
        """A checkpoint's client states: those it holds are pushed; the nodes load the others from the
        rounds they saved on their own disks."""
        from fdlit.deployment.node_checkpoints import STUB, is_stub

        plain = [(c, s) for c, s in zip(clients, states, strict=True) if not is_stub(s)]
        for client, state in plain:
            client.load_client_state(state)
        if plain:
            self.push_states([c for c, _ in plain])
        saved = {c.client_id: s[STUB] for c, s in zip(clients, states, strict=True) if is_stub(s)}
        if saved:
            self.node_key = next(iter(saved.values()))["key"]  # the resumed run saves where it saved before
            self._saved.update({i: int(s["round"]) for i, s in saved.items()})
            self._restore(sorted(saved))

    def _restore(self, ids: list[int]) -> None:
        """The nodes hosting ``ids`` load their saved states (the round ``_saved`` names for each)."""
        per_node: dict[int, dict] = {}
        for i in ids:
            per_node.setdefault(self.node_of[i], {})[str(i)] = self._saved[i]
        self._cache = {k: v for k, v in self._cache.items() if k[1] not in set(ids)}
        self._states = {i: v for i, v in self._states.items() if i not in set(ids)}
        self.request("restore", {n: ({"key": self.node_key, "rounds": rounds}, {}) for n, rounds in per_node.items()})

    def _restore_or_push(self, ids: list[int]) -> None:
        """A node taking over lost clients: their last saved states from its own disk (the lost node's
        machine, restarted), else the server's copies (the last states it holds, or the initial ones)."""
        from fdlit.deployment.messages import NodeRefused

        saved = [i for i in ids if i in self._saved]
        if saved:
            try:
                self._restore(saved)
                ids = [i for i in ids if i not in saved]
            except NodeRefused as exc:
                warnings.warn(f"FlowerExecutor: {exc}; its clients continue from the server's copies")
        if ids:
            self.push_states([self.loop.parts.clients.clients[c] for c in ids])
