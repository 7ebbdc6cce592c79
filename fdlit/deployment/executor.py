"""FlowerExecutor: the executor interface over a Flower Grid; a round is one or two exchanges per node.

The ServerApp runs fdlit's ordinary FederationLoop with this executor, so every method and protocol
runs unchanged. Each executor call becomes one Message to each SuperNode hosting some of its clients:
the round's client step (private phase, evaluation, upload), the public phase, and the rarer train /
predict / hook / state requests; the parameter exchange's receive travels with the next round's
step (fdlit.deployment.carried). Replies are checked
(fdlit.deployment.replies): an invalid one makes its node a dropout of the round. Tensors a node
builds itself (its clients' data, the public, test and validation sets) are named; anything else
(the teacher, a broadcast, a public subset) goes down once per node and is named by a token after.
Every Message's serialised size is counted by operation and direction (``comm/wire_*``). Under secure
aggregation the uploads stay on the nodes and three exchanges give the server their sum
(fdlit.deployment.secure_rounds).
"""

from __future__ import annotations

import math
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from fdlit.deployment.carried import CarriedReceive
from fdlit.deployment.membership import apply_local_classes, assign_order, client_blocks
from fdlit.deployment.messages import NodeFailure, NodeLink
from fdlit.deployment.node_requests import NodeRequests
from fdlit.deployment.realtime import RealTimeJobs, without_clock
from fdlit.deployment.replies import check_losses, check_step, messages_of, row_masks
from fdlit.deployment.secure_rounds import SecureRounds
from fdlit.execution.executor import ClientExecutor
from fdlit.execution.steps import predicted_correct, report
from fdlit.execution.tokens import Tokens
from fdlit.messages import Message, array_bytes


class FlowerExecutor(CarriedReceive, NodeRequests, RealTimeJobs, ClientExecutor):
    """Clients hosted by Flower SuperNodes, driven from a ServerApp.

    Args:
        grid: the ServerApp's Flower ``Grid``.
        nodes: how many SuperNodes to wait for before set-up.
        timeout_s: how long one request may take on a node (training included) before the run fails.
        node_wait_s: how long to wait at set-up for ``nodes`` SuperNodes to connect.
        threads: torch threads of each node worker (null: the worker's default).
    """

    def __init__(self, grid: Any, nodes: int, timeout_s: float = 600.0, node_wait_s: float = 120.0,
                 threads: int | None = None):
        self.grid = grid
        self.link = NodeLink(grid, timeout_s, lambda node: sorted(c for c, n in self.node_of.items() if n == node))
        self.nodes = nodes
        self.timeout_s, self.node_wait_s = timeout_s, node_wait_s
        self._unused: set[int] = set()  # connected nodes that replace no lost node
        self.threads = threads
        self.loop = None
        self.config_yaml = ""
        self.node_ids: list[int] = []
        self.node_of: dict[int, int] = {}  # client id -> node id
        self._token = Tokens()  # what went down to the nodes once, named afterwards
        self._has: dict[int, set[int]] = {}
        self._names: dict[int, tuple[torch.Tensor, list]] = {}
        self._cache: dict[tuple[int, int], torch.Tensor] = {}  # (id of a named input, client id) -> logits
        self._dropped: dict[int, str] = {}  # node -> why its reply this round was refused (its clients: dropouts)
        self._states: dict[int, Any] = {}  # client id -> its state as sent with a round's last reply
        self.states_every: int | None = None  # the run's checkpoint.every_n_rounds (None: no checkpoints)
        self.node_key = uuid.uuid4().hex  # names the run's checkpoints on the nodes' disks (a resume keeps it)
        self._saved: dict[int, int] = {}  # client id -> the last round its node saved it
        self._round = 0
        self._upload_bytes = 0  # bytes of the arrays the clients' uploads carried this round
        self.secure = SecureRounds(self.request, lambda: self.node_of)  # secure aggregation's server half
        self._carry_reset()
        self._realtime_reset()

    def bind(self, loop: Any, config_yaml: str) -> None:
        """The loop whose tensors nodes build themselves, and the config they build them from."""
        self.loop, self.config_yaml = loop, without_clock(config_yaml) if loop.clock is not None else config_yaml

    @property
    def lost_nodes(self) -> set[int]:
        return self.link.lost

    def unreachable(self) -> frozenset[int]:
        out = self.link.lost | set(self._dropped)
        return frozenset(c for c, n in self.node_of.items() if n in out)

    def _ref(self, obj: torch.Tensor | None, node: int, out: dict[str, torch.Tensor]):
        """How ``node`` finds ``obj``: by name when it builds it itself, else by token (sent once)."""
        if obj is None:
            return None
        named = self._names.get(id(obj))
        if named is not None and named[0] is obj:
            return named[1]
        token = self._token(obj)
        if token not in self._has[node]:
            out[f"t{token}"] = obj
            self._has[node].add(token)
        return ["token", token]

    def _names_of_loop(self) -> None:
        loop = self.loop
        names = {k: getattr(loop.parts.tensors, k) for k in ("public_x", "public_y", "test_x", "test_y", "val_x", "val_y")}
        self._names = {id(t): (t, [k]) for k, t in names.items() if t is not None}
        for i, (x, y) in enumerate(loop.parts.tensors.private):
            self._names[id(x)] = (x, ["private", i, 0])
            self._names[id(y)] = (y, ["private", i, 1])

    def _groups(self, clients: Sequence) -> dict[int, list[int]]:
        """Positions in ``clients`` by the node hosting each; clients of lost nodes are left out."""
        groups: dict[int, list[int]] = {}
        for j, c in enumerate(clients):
            node = self.node_of[c.client_id]
            if node not in self.lost_nodes and node not in self._dropped:
                groups.setdefault(node, []).append(j)
        return groups

    def _prune(self) -> None:
        live = set(self._token.live())  # what the server dropped, nodes may drop too
        for has in self._has.values():
            has.intersection_update(live)

    # ------------------------------------------------------------------ set-up and teardown
    def setup(self, fabric, clients) -> None:
        self.device = self.secure.device = fabric.device
        deadline = time.monotonic() + self.node_wait_s
        while len(nodes := sorted(self.grid.get_node_ids())) < self.nodes:
            if time.monotonic() > deadline:
                raise NodeFailure(f"{len(nodes)} of {self.nodes} SuperNodes connected within {self.node_wait_s:g} s")
            time.sleep(0.2)
        # the first message starts each node's worker, set-up builds the federation there: node_wait_s
        start_s = max(self.timeout_s, self.node_wait_s)
        hello = self.request("hello", {n: ({}, {}) for n in nodes[: self.nodes]}, timeout_s=start_s)
        self.node_ids = assign_order(hello)
        hosted = client_blocks([c.client_id for c in clients], self.node_ids)
        self.node_of = {cid: n for n, ids in hosted.items() for cid in ids}
        self._has = {n: set() for n in self.node_ids}
        requests = {n: self._setup_request(ids, bool(hello[n][0].get("local_data"))) for n, ids in hosted.items()}
        replies = self.request("setup", requests, timeout_s=start_s)
        self._names_of_loop()
        apply_local_classes(self.loop, replies)

    def _setup_request(self, ids: list[int], local_data: bool) -> tuple[dict, dict[str, torch.Tensor]]:
        """What a node builds its clients from: the config, its client ids, the random state each of
        their networks is drawn from (as fit drew it); for a node with its own data, the shared sets
        (it holds no copy of the dataset)."""
        draws = self.loop.draws
        meta = {"config": self.config_yaml, "clients": ids, "threads": self.threads}
        tensors = {"draws": torch.stack([draws.before[i] for i in ids]), "draws_after": draws.after}
        if local_data:
            from fdlit.data.node_local import shared_sets

            meta["shared"], shared = shared_sets(self.loop.data)
            tensors |= shared
        return meta, tensors

    def teardown(self, clients) -> None:
        if not self.node_ids:
            return
        run_failed = sys.exc_info()[0] is not None
        if run_failed:
            self._pending = {}  # a receive that waited for a round that never came
        busy = self._abandon_jobs()  # real time: nodes still working on jobs no release will take
        try:
            if clients and not run_failed:
                self.fetch_states([c for c in clients if self.node_of[c.client_id] not in busy])
        finally:
            try:
                self.request("teardown", {n: ({}, {}) for n in self.node_ids if n not in self.lost_nodes | busy})
            except NodeFailure as exc:
                warnings.warn(f"FlowerExecutor: a node did not confirm the end of the run: {exc}")
            self.node_ids = []

    def timing_metrics(self) -> dict[str, object]:
        """The round's real costs (NodeLink.round_metrics) and the nodes whose replies were refused; for a
        round whose receive the next round's step carried, up to that step."""
        out, self._reported = self._reported or self._round_costs(), None
        return out

    def _round_costs(self) -> dict[str, object]:
        out = self.link.round_metrics(self.node_ids)
        out["nodes/invalid_replies"] = sorted(self._dropped)
        out["comm/wire_upload_bytes"], self._upload_bytes = self._upload_bytes, 0
        return out

    # ------------------------------------------------------------------ evaluation sent ahead
    def _evaluated_sets(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """What the loop evaluates after clients change: the test and validation sets. Nodes measure
        their clients there (which samples each predicts right) and send those bits with the reply
        that changed the clients: the predictions stay on the node and no Message is spent on them.
        Never the public set: its logits leave a node only in the upload, released (DP, encoding) there."""
        loop = self.loop
        t = loop.parts.tensors
        pairs = [(t.test_x, t.test_y), (t.val_x, t.val_y)]
        return [(x, y) for x, y in pairs if x is not None]

    def _measure(self, inputs, node: int, out: dict[str, torch.Tensor]) -> list:
        return [[self._ref(x, node, out), self._ref(y, node, out)] for x, y in inputs]

    def _changed(self, clients, idx, replies, groups, inputs) -> None:
        """Forget the changed clients' evaluation and states; keep the evaluation the nodes sent ahead."""
        changed = {clients[j].client_id for j in idx}
        self._cache = {k: v for k, v in self._cache.items() if k[1] not in changed}
        for i in changed:
            self._states.pop(i, None)
        for _, (meta, _) in replies.items():  # what the clients' steps logged (self.log), per client
            for name, values in meta.get("logged", {}).items():
                self.__dict__.setdefault("_logged", {}).setdefault(name, []).extend(values)
        for node, (_, tensors) in replies.items():
            for k, (x, _) in enumerate(inputs):
                for j, z in zip(groups[node], tensors[f"pred/{k}"], strict=True):
                    self._cache[(id(x), clients[j].client_id)] = z

    def correct(self, clients, x, y, rows=None):
        named, lost = self._names.get(id(x)), self.unreachable()
        if named is None or named[0] is not x or any(
                c.client_id not in lost and (id(x), c.client_id) not in self._cache for c in clients):
            return predicted_correct(self, clients, x, y, rows)  # not measured ahead: the nodes predict, the server compares
        nan = torch.full((len(y),), math.nan)  # a client that could not be reached: no accuracy
        out = torch.stack([nan if c.client_id in lost else self._cache[(id(x), c.client_id)].float()
                           for c in clients]).to(x.device)
        return out if rows is None else out[:, rows]

    def _rejoin(self) -> None:
        """A SuperNode that connected after a node was lost (restarted with the lost one's
        ``partition-id``; any new node when nodes have none) takes over its clients at the start of
        a round: it builds the federation from the config, receives the clients' latest states the
        server holds (those of the last checkpoint, else the initial ones) and takes part from then on."""
        lost = [n for n in self.node_ids if n in self.lost_nodes]
        if not lost:
            return
        fresh = [n for n in self.grid.get_node_ids() if n not in self.node_ids and n not in self._unused]
        if not fresh:
            return
        hello = self.request("hello", {n: ({}, {}) for n in fresh}, tolerate=True, timeout_s=self.node_wait_s)
        for node, (meta, _) in sorted(hello.items()):
            part = meta.get("partition_id")
            position = part if part is not None else self.node_ids.index(lost[0]) if lost else None
            if position is None or not 0 <= position < len(self.node_ids) or self.node_ids[position] not in lost:
                self._unused.add(node)  # not a lost node's partition: not asked again
                continue
            old = self.node_ids[position]
            ids = [c for c, n in self.node_of.items() if n == old]
            self.request("setup", {node: self._setup_request(ids, bool(meta.get("local_data")))},
                         timeout_s=max(self.timeout_s, self.node_wait_s))
            self.node_ids[position], self._has[node] = node, set()
            self.node_of.update({c: node for c in ids})
            lost.remove(old)
            self._restore_or_push(ids)
            warnings.warn(f"FlowerExecutor: node {node} took over lost node {old}'s clients {ids}")

    # ------------------------------------------------------------------ replies checked, states kept
    def _valid(self, replies: dict, check) -> dict:
        """The replies that are valid; a node whose reply is not (non-finite numbers, wrong counts or
        shapes, a numerical fault on the node) is a dropout of this round, named in a warning and in
        the round's ``nodes/invalid_replies``."""
        kept = {}
        for node, (meta, tensors) in replies.items():
            why = meta.get("invalid") or check(node, meta, tensors)
            if why:
                self._dropped[node] = why
                warnings.warn(f"FlowerExecutor: node {node} sent an invalid reply in round {self._round} ({why}); "
                              f"its clients {self.link.clients_of(node)} are dropouts of this round")
            else:
                kept[node] = (meta, tensors)
        return kept

    @staticmethod
    def _losses(count: int, replies: dict, groups: dict[int, list[int]]) -> list[float]:
        """Each client's mean loss from its node's reply, by position; NaN where no valid reply came."""
        losses = [math.nan] * count
        for node, (meta, _) in replies.items():
            for j, loss in zip(groups.get(node, []), meta["losses"], strict=True):
                losses[j] = loss
        return losses

    def _wants_states(self) -> bool:
        """Whether the round ends in a checkpoint, whose client states the round's last reply then carries."""
        every = self.states_every
        # real time: every release, as the clients it reached start jobs the checkpoint must not see
        return bool(every) and (self._round % every == 0 or self._round >= self.loop.settings.rounds or self.realtime)

    def _states_ask(self) -> dict:
        """What a round's last request asks of the nodes for its checkpoint: nothing (no checkpoint);
        the last round's states, sent up (the finished run's checkpoint holds them); else each node
        saves its clients' states on its own disk (fdlit.deployment.node_checkpoints)."""
        if not self._wants_states():
            return {}
        if self._round >= self.loop.settings.rounds:
            return {"then_states": True}
        return {"save_states": {"key": self.node_key, "round": self._round}}

    def _keep_states(self, replies: dict, saved: str = "saved") -> None:
        from fdlit.deployment.wire import from_bytes

        for _, (meta, tensors) in replies.items():
            if saved in meta:  # [round, client ids]: saved on the node
                self._saved.update(dict.fromkeys(meta[saved][1], int(meta[saved][0])))
            if "states" in tensors:
                self._states.update(zip(meta["state_ids"], from_bytes(tensors["states"]), strict=True))

    # ------------------------------------------------------------------ the executor interface
    def client_step(self, step):
        """The round's client step in one exchange per node: each node trains its sampled clients,
        predicts the evaluation sets with them, and its arriving clients make their upload (public
        inference, the method's upload, the privacy release, all on the node); one reply each."""
        self._report_open_round()
        self._round = step.round
        self._rejoin()  # a round begins: nodes that replace lost ones join here
        self._dropped.clear()  # a node that sent an invalid reply last round takes part again
        self._prune()
        if self.realtime and step.round > 1:  # each client's job ran on its own: its reply has landed
            return self._landed_step(step)
        trained, uploading = self._groups(step.trained), self._groups(step.uploading)
        inputs = self._evaluated_sets()
        info = step.info
        expect = (len(info.public_x), self.loop.parts.facts.num_classes) if step.upload == "predictions" else None
        secure = step.upload is not None and self.loop.privacy.secure  # keys go up, the uploads stay on the nodes
        per_node = {}
        for node in sorted(set(trained) | set(uploading)):
            out: dict[str, torch.Tensor] = {}
            idx = trained.get(node, [])
            meta: dict[str, Any] = {
                "round": step.round, "ids": [step.trained[j].client_id for j in idx],
                "datasets": [[self._ref(step.datasets[j][0], node, out), self._ref(step.datasets[j][1], node, out)]
                             for j in idx],
                "epochs": step.epochs, "batch_size": step.batch_size,
                "then_measure": self._measure(inputs, node, out)}
            if step.upload is not None and node in uploading:
                meta["upload"] = {"kind": step.upload, "ids": [step.uploading[j].client_id for j in uploading[node]],
                                  "clients": list(info.clients), "public_index": self._ref(info.public_index, node, out),
                                  "received": {k: self._ref(v, node, out) for k, v in step.received.items()}}
            if secure:  # with what the method's client-side terms read of the server's state (``secure_state``)
                method = self.loop.server_side.method
                meta["secagg"] = {**self.secure.step_meta(step.round, meta["ids"]), "state": {
                    name: self._ref(getattr(method, name), node, out) for name in getattr(method, "secure_state", ())}}
            per_node[node] = (meta, out)
        carried = self._carry_into(per_node)  # the previous round's receive, loaded before training
        replies = self.request("step", per_node, tolerate=True)
        masks = row_masks(self.loop.parts.clients.method_part.uploads)
        replies = self._valid(replies, lambda node, meta, tensors: check_step(
            meta, tensors, len(trained.get(node, [])), len(uploading[node]) if node in uploading else 0, expect, masks))
        self._took_carried(replies, *carried)
        if secure:
            self.secure.keep_keys(replies)
        losses = self._losses(len(step.trained), replies, trained)
        self._released_at = time.monotonic()  # real time: the first release waits for every upload
        self._changed(step.trained, range(len(step.trained)), {n: r for n, r in replies.items() if n in trained},
                      trained, inputs)
        report(self, "private", len(step.trained), len(step.trained))
        messages = [Message() for _ in step.uploading]
        for node, (meta, tensors) in replies.items():
            for j, m in zip(uploading.get(node, []), messages_of(meta.get("upload"), tensors, self.device), strict=True):
                messages[j] = m
                self._upload_bytes += sum(map(array_bytes, m.arrays.values()))  # as the node sent them (released, encoded)
        return losses, messages

    def secure_sum(self, r, sampled, clients, fraction, send, stage="", maximum=None):
        """Secure aggregation with the clients' half on the nodes (fdlit.deployment.secure_rounds): the
        server receives only the sum (of the terms, or of ``stage`` levels' codes)."""
        return self.secure.secure_sum(r, sampled, clients, fraction, send, stage=stage, maximum=maximum)

    def distil(self, part, clients, teachers, private, epochs, batch_size):
        """The public phase in one exchange per node: the (public inputs, targets) each client was sent
        go down (once per node each); the node makes each client's training set with its own data and
        the method's ``distillation_set``, trains, predicts the evaluation sets, and sends its clients'
        states with the reply when the round ends in a checkpoint."""
        self._prune()
        groups = self._groups(clients)
        inputs = self._evaluated_sets()
        per_node = {}
        for node, idx in groups.items():
            out: dict[str, torch.Tensor] = {}
            per_node[node] = ({"ids": [clients[j].client_id for j in idx], "epochs": epochs, "batch_size": batch_size,
                               "teachers": [[self._ref(teachers[j][0], node, out), self._ref(teachers[j][1], node, out)]
                                            for j in idx],
                               "then_measure": self._measure(inputs, node, out),
                               **self._states_ask()}, out)
        started = self._distil_holds(clients, per_node, groups) if self.realtime else None
        replies = self.request("distil", per_node, tolerate=True, on_reply=started)
        replies = self._valid(replies, lambda node, meta, tensors: check_losses(meta, len(groups[node])))
        losses = self._losses(len(clients), replies, groups)
        self._changed(clients, range(len(clients)), replies, groups, inputs)
        self._keep_states(replies)
        report(self, "public", len(clients), len(clients))
        return losses
