"""Asynchronous federated distillation on real time: each client's job is its own Message, and a release
takes the uploads that have arrived.

Under ``fit`` an ``AsynchronousClock`` decides from its devices' virtual times which uploads each
release takes (fdlit.federation.clock). Under ``fdlit deploy`` the same semantics run on real time: a
client starts its next job (private phase, public inference, upload) as soon as it has distilled a
teacher, as one Message to its node, and the server's release waits for the ``buffer`` replies that
come back first (Flower's Grid hands over replies as they arrive), whatever the profile says; the
clients that arrived receive the teacher and start again. A client's job changes nothing else
until it arrives, so its reply is what ``fit`` would compute when it lands; it is taken as the
client step of the release it lands in, and its node's evaluation of the client after the private
phase comes with it.

With the clock's ``real_time_scale`` s the nodes hold each reply until s real seconds per virtual
second of what the client's device takes (the distillation after a release, then the next job),
counted from the real release (the server's own work since then is taken off): injected per-node
delays, so a deployment's arrivals follow the profile and its releases take the uploads a
virtual-clock ``fit`` takes. Without it, the nodes' own speed decides.

A job knows the release it starts for, not the one it lands in: its ``FederationInfo`` names that
round and only its own client (the private-epoch count is the same for every release after the first).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from fdlit.deployment.replies import check_losses, check_step, messages_of, row_masks
from fdlit.execution.steps import predicted_correct, report
from fdlit.messages import Message, array_bytes


class RealTimeJobs:
    """Mixed into :class:`~fdlit.deployment.executor.FlowerExecutor` (its link, references and checks)."""

    def _realtime_reset(self) -> None:
        self._jobs: dict[str, tuple[int, int]] = {}  # message id -> (client id, node) of a job in flight
        self._landed: dict[int, tuple[int, tuple | None, float]] = {}  # client id -> (node, reply, sent at)
        self._holds: dict[int, float] = {}  # client id -> virtual seconds from the release to its next upload
        self._released_at = 0.0  # time.monotonic() of the last release (when its last upload arrived)

    @property
    def realtime(self) -> bool:
        clock = getattr(self.loop, "clock", None)
        return clock is not None and getattr(clock, "asynchronous", False) and clock.predictions

    def _scale(self) -> float:
        return float(self.loop.clock.real_time_scale or 0.0)

    # ------------------------------------------------------------------ the releases
    def arrivals(self, count: int) -> list[int] | None:
        """The ``count`` clients whose jobs' uploads arrived first (in arrival order, then sorted);
        waits for them. A node that does not answer within the request timeout is lost: its clients
        are dropouts of the release they land in."""
        if not self.realtime:
            return None
        if not self._jobs and not self._landed:  # a resumed run: nothing is in flight
            self._restart()
        started = time.monotonic()
        deadline = started + self.timeout_s
        while len(self._landed) < count and self._jobs:
            for reply in self.grid.pull_messages(list(self._jobs)):
                client, node = self._jobs.pop(reply.metadata.reply_to_message_id)
                taken = self.link.take("step", node, reply, tolerate=True)
                self._landed[client] = (node, taken, taken[0].get("sent_at", time.time()) if taken else time.time())
            if len(self._landed) >= count or not self._jobs:
                break
            if time.monotonic() > deadline:
                late = sorted({node for _, node in self._jobs.values()})
                self.link.lose(late, f"no upload within {self.timeout_s:g} s")
                for client, node in self._jobs.values():
                    self._landed[client] = (node, None, time.time())
                self._jobs = {}
                break
            time.sleep(0.005)
        self.link.exchanges.append(time.monotonic() - started)
        # in the order the uploads left their nodes (the order they were pulled in is the polling's)
        first = sorted(self._landed, key=lambda c: self._landed[c][2])[:count]
        if first:  # the release is when its last upload arrived, though the server may come to it later
            self._released_at = time.monotonic() - (time.time() - self._landed[first[-1]][2])
        return sorted(first)

    def _restart(self) -> None:
        """A resumed run: every client is as its last distillation left it (the nodes restored it), so each
        is measured on the evaluation sets as it is, then starts the job it had in flight when the run
        stopped (a job changes nothing until it lands), held until the virtual time it would arrive."""
        from fdlit.federation.round_facts import RoundPlan

        loop = self.loop
        clients = [c for c in loop.parts.clients.clients if self.node_of[c.client_id] not in self.lost_nodes]
        for x, y in self._evaluated_sets():
            for client, row in zip(clients, predicted_correct(self, clients, x, y), strict=True):
                self._cache[(id(x), client.client_id)] = row
        clock, r = loop.clock, loop.round + 1
        expected = clock.expected_arrivals(loop.parts, RoundPlan(r, [], [], None, False, None))
        self._holds = {i: t - clock.timeline.now for i, t in expected.items()}
        self._released_at = time.monotonic()
        self._round = loop.round
        self._dispatch(clients, r)

    def _abandon_jobs(self) -> set[int]:
        """The run ends with jobs in flight: their nodes are told to end once done (not waited for; their
        clients' states as the last distillation left them are those the nodes saved). Those nodes."""
        busy = {node for _, node in self._jobs.values()} - self.lost_nodes
        if busy:
            self.link.send("teardown", [(n, {}, {}) for n in sorted(busy)], self._token.live())
        self._jobs, self._landed = {}, {}
        return busy

    def _landed_step(self, step) -> tuple[list[float], list[Message]]:
        """The client step of a release from the replies its clients' jobs sent: losses, the evaluation
        after the private phase (measured on the nodes) and the uploads, checked as a round's step is."""
        inputs = self._evaluated_sets()
        expect = (len(step.info.public_x), self.loop.parts.facts.num_classes)
        masks = row_masks(self.loop.parts.clients.method_part.uploads)
        losses, messages = [math.nan] * len(step.trained), [Message() for _ in step.trained]
        for j, client in enumerate(step.trained):
            node, reply, _ = self._landed.pop(client.client_id)
            if reply is None:  # its node was lost
                continue
            kept = self._valid({node: reply}, lambda node, meta, tensors: check_step(meta, tensors, 1, 1, expect, masks))
            if not kept:
                self._dropped.pop(node, None)  # the client is the dropout, not its node's other clients
                continue
            meta, tensors = kept[node]
            losses[j] = meta["losses"][0]
            self._changed(step.trained, [j], kept, {node: [j]}, inputs)
            messages[j] = messages_of(meta.get("upload"), tensors, self.device)[0]
            self._upload_bytes += sum(map(array_bytes, messages[j].arrays.values()))
        report(self, "private", len(step.trained), len(step.trained))
        return losses, messages

    def _dispatch(self, clients: list[Any], round_: int) -> None:
        """Each of ``clients`` (it has just distilled) starts its next job, one Message to its node, the
        reply held there for its device's job time when the run scales time (``_holds``)."""
        loop = self.loop
        if round_ > loop.settings.rounds:
            return
        parts, s = loop.parts, loop.settings
        inputs = self._evaluated_sets()
        received = parts.server.received
        messages, ids = [], []
        for client in clients:
            i, node = client.client_id, self.node_of[client.client_id]
            if node in self.lost_nodes:
                continue
            out: dict[str, torch.Tensor] = {}
            x, y = parts.tensors.private[i]
            meta: dict[str, Any] = {
                "round": round_, "ids": [i], "datasets": [[self._ref(x, node, out), self._ref(y, node, out)]],
                "epochs": s.private_epochs_of(round_), "batch_size": parts.batch_size,
                "then_measure": self._measure(inputs, node, out),
                "upload": {"kind": "predictions", "ids": [i], "clients": [i], "public_index": None,
                           "received": {k: self._ref(v, node, out) for k, v in received.items()}}}
            meta["hold_s"] = self._hold(self._holds.pop(i, 0.0))  # 0 without a scale: the reply says when it left
            messages.append((node, meta, out))
            ids.append((i, node))
        self._jobs.update(zip(self.link.send("step", messages, self._token.live()), ids, strict=True))

    def _distil_holds(self, clients: list[Any], per_node: dict, groups: dict[int, list[int]]):
        """The release's distillation: under a scaled clock each node holds its reply for its slowest
        client's virtual download and public phase, and each client's next job for its own job time.
        Returns what starts a node's next jobs as soon as its distillation reply comes (each client
        starts its next job once it has distilled, whatever the other nodes do)."""
        if self._scale():
            holds = self.loop.clock.holds(self.loop.parts, self._release_plan(), [c.client_id for c in clients])
            for node, (meta, _) in per_node.items():
                meta["hold_s"] = self._hold(max(holds[i][0] for i in meta["ids"]))
            self._holds.update({i: h[1] for i, h in holds.items()})

        def started(node: int, meta: dict, tensors: dict) -> None:
            if "invalid" not in meta and not check_losses(meta, len(groups[node])):
                self._dispatch([clients[j] for j in groups[node]], self._round + 1)

        return started

    def _hold(self, virtual_s: float) -> float:
        """Real seconds a node holds a reply it starts now, to send it ``virtual_s`` after the release."""
        return max(0.0, self._scale() * virtual_s - (time.monotonic() - self._released_at))

    def _release_plan(self):
        from fdlit.federation.round_facts import RoundPlan

        return RoundPlan(self._round, [], [], None, False, None)


def without_clock(config_yaml: str) -> str:
    """The config the nodes build their clients from, without ``federation.clock``: the server keeps the
    time (a node holds a reply for what the server asks), and a node constructs only what its allow-list names."""
    import yaml

    config = yaml.safe_load(config_yaml)
    config["federation"]["clock"] = None
    return yaml.safe_dump(config, sort_keys=False)
