"""Requests to the SuperNodes as Flower Messages, their replies, and what they cost on the wire.

One request is one Message per node (``query.fdlit``; what to do is in its meta record), pushed
through the ServerApp's Grid; replies are pulled with short, backing-off polling that starts when
replies are due (:class:`ReplyClock`). Every Message's
serialised size is counted by operation and direction; each reply carries its node worker's CPU
seconds and peak memory. A node that does not answer in time is *lost* when the caller tolerates
it (training, prediction, state): its clients become dropouts; otherwise the run stops naming it.
"""

from __future__ import annotations

import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from fdlit.deployment.wire import pack, unpack, wire_bytes

MESSAGE_TYPE = "query.fdlit"
# how often the ServerApp asks the SuperLink for replies once they are due: after half the time they
# are overdue, between 20 and 50 ms, or up to POLL_SHARE of the request's time so far on a long one
# (Flower's own send_and_receive waits 3 s between asks; a round's exchange takes a few tenths of a
# second on loopback, and each ask is a request the SuperLink serves)
POLL_S = (0.02, 0.05)
POLL_SHARE = 0.05
# the share of a node's time to reply to the last like request that passes before it is asked
DUE_SHARE = 0.8


class ReplyClock:
    """When to ask for replies. Flower's Grid offers no wait for them (``send_and_receive`` asks every
    3 s), so the ServerApp asks; a node answers a request like the last one of its kind (the same
    operation, epochs and clients: a round's client step or public phase) in about the time it took
    then, so the next ask waits until ``DUE_SHARE`` of that time has passed for some node still
    awaited: the asks a round's training would meet with empty answers, each a request the SuperLink
    serves, are not made."""

    def __init__(self):
        self.reply_s: dict[tuple, dict[int, float]] = {}  # kind of request -> node -> seconds to its reply

    @staticmethod
    def kind(op: str, per_node: dict) -> tuple:
        metas = [meta for meta, _ in per_node.values()]
        return (op, sum(len(m.get("ids", ())) for m in metas), max((m.get("epochs", 0) for m in metas), default=0),
                sum(len(m.get("receive", ())) for m in metas))

    def due(self, kind: tuple | None, nodes) -> float:
        """Seconds after the request was sent at which the first of ``nodes`` is due to have replied
        (``kind`` None: at once)."""
        last = self.reply_s.get(kind, {})
        return DUE_SHARE * min((last.get(n, 0.0) for n in nodes), default=0.0)

    def replied(self, kind: tuple, node: int, seconds: float) -> None:
        self.reply_s.setdefault(kind, {})[node] = seconds

    @staticmethod
    def pause(overdue_s: float, waited_s: float, kind: tuple | None) -> float:
        """The wait between asks once a reply is due: half the time since, 20 to 50 ms, or up to
        ``POLL_SHARE`` of the time waited (``kind`` None: 50 ms): a late reply is at most that much
        later noticed."""
        return min(max(overdue_s / 2, POLL_S[0]), max(POLL_S[1], POLL_SHARE * waited_s if kind else 0.0))


class NodeFailure(RuntimeError):
    """A node did not answer in time or its worker failed."""


class NodeRefused(NodeFailure):
    """A node refused the run (code its operator does not allow, data it cannot use): its one line."""


class NodeLink:
    """The ServerApp's side of the conversation with the node workers."""

    def __init__(self, grid: Any, timeout_s: float, clients_of: Callable[[int], list[int]]):
        self.grid = grid
        self.timeout_s = timeout_s
        self.clients_of = clients_of  # for messages: the clients a node hosts
        self.wire: dict[str, float] = defaultdict(float)  # "<op>_<up|down>" -> bytes since the last round ended
        self.wire_total = {"up": 0, "down": 0}
        self.node_cpu: dict[int, float] = {}  # each node worker's CPU seconds so far
        self.node_peak_rss: dict[int, int] = {}
        self.lost: set[int] = set()
        self.exchanges: list[float] = []  # seconds each request took since the last round ended
        self.messages = 0  # Messages sent to the nodes since the last round ended
        self.pulls = 0  # asks for replies since the last round ended
        self.clock = ReplyClock()
        self._cpu_reported: dict[int, float] = {}

    def request(self, op: str, per_node: dict[int, tuple[dict, dict[str, torch.Tensor]]], live: list[int],
                tolerate: bool = False, timeout_s: float | None = None,
                on_reply: Callable[[int, dict, dict], None] | None = None) -> dict[int, tuple]:
        """Send ``op`` to each node with its (meta, tensors); wait for every reply; (meta, tensors) back.
        ``tolerate``: a node that does not answer within ``timeout_s`` (or that Flower reports
        unavailable) is lost from then on, and its clients are unreachable: dropouts for the loop.
        ``live``: the tokens the server still holds (nodes may drop the others). ``on_reply(node, meta,
        tensors)``: called as each reply comes, before the others are waited for; such a request is asked
        about from the start, every 20-50 ms (when a reply comes, not when it is due, decides what follows)."""
        started = time.monotonic()
        kind = None if on_reply is not None else self.clock.kind(op, per_node)
        items = [(node, meta, tensors) for node, (meta, tensors) in per_node.items()]
        sent_to = dict(zip(self.send(op, items, live), per_node, strict=True))
        replies: dict[int, tuple] = {}
        timeout_s = timeout_s or self.timeout_s
        deadline = time.monotonic() + timeout_s
        pending = set(sent_to)
        while pending:
            due = started + self.clock.due(kind, [sent_to[m] for m in pending])
            now = time.monotonic()
            if now < due:  # none of them due yet: asking would bring nothing
                time.sleep(max(0.0, min(due, deadline) - now))
            self.pulls += 1
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                node = sent_to[mid]
                pending.discard(mid)
                if kind is not None:
                    self.clock.replied(kind, node, time.monotonic() - started)
                taken = self.take(op, node, reply, tolerate)
                if taken is not None:
                    replies[node] = taken
                    if on_reply is not None:
                        on_reply(node, *taken)
            if pending:
                if time.monotonic() > deadline:
                    late = sorted(sent_to[m] for m in pending)
                    if tolerate:
                        self.lose(late, f"no reply to '{op}' within {timeout_s:g} s")
                        break
                    raise NodeFailure(f"no reply to '{op}' from node(s) {late} within {timeout_s:g} s "
                                      f"(deploy --timeout)")
                due = started + self.clock.due(kind, [sent_to[m] for m in pending])
                if time.monotonic() >= due:  # overdue: asked again soon
                    time.sleep(self.clock.pause(time.monotonic() - due, time.monotonic() - started, kind))
        self.exchanges.append(time.monotonic() - started)
        return replies

    def send(self, op: str, messages: list[tuple[int, dict, dict[str, torch.Tensor]]], live: list[int]
             ) -> list[str]:
        """Push one Message per (node, meta, tensors), without waiting: their message ids, in order."""
        from flwr.app import Message

        out = []
        for node, meta, tensors in messages:
            content = pack({"op": op, "live": live, **meta}, tensors)
            self.wire[f"{op}_down"] += (n := wire_bytes(content))
            self.wire_total["down"] += n
            out.append(Message(content, dst_node_id=node, message_type=MESSAGE_TYPE))
        self.messages += len(out)
        return list(self.grid.push_messages(out))

    def take(self, op: str, node: int, reply: Any, tolerate: bool) -> tuple | None:
        """One reply to ``op`` from ``node``: its (meta, tensors), counted on the wire; None when the node
        failed it and ``tolerate`` (the node is lost), else the failure raised."""
        if reply.has_error():
            if tolerate:
                self.lose([node], f"'{op}' failed: {reply.error.reason}")
                return None
            raise NodeFailure(f"node {node} failed '{op}': {reply.error.reason}")
        self.wire[f"{op}_up"] += (n := wire_bytes(reply.content))
        self.wire_total["up"] += n
        try:
            meta, tensors = unpack(reply.content)
            if not isinstance(meta, dict):
                raise TypeError("its JSON part is not an object")
        except (ValueError, RuntimeError, KeyError, TypeError) as exc:  # not a reply fdlit's node makes
            if not tolerate:
                raise NodeFailure(f"node {node} sent a malformed reply to '{op}': {exc}") from None
            meta, tensors = {"invalid": f"a malformed reply: {exc}", "cpu_s": 0.0, "peak_rss": 0}, {}
        if "error" in meta and tolerate and meta.get("error_kind") == "NumericalFault":
            # the node's own clients diverged: an invalid reply, so a dropout of the round (the caller's)
            meta = {**meta, "invalid": meta["error"].strip().splitlines()[-1]}
        elif "error" in meta and meta.get("error_kind") == "ConfigError":
            raise NodeRefused(f"node {node} refused '{op}': {meta['error']}")
        elif "error" in meta:
            raise NodeFailure(f"node {node} failed '{op}':\n{meta['error']}")
        self.node_cpu[node] = float(meta.get("cpu_s", self.node_cpu.get(node, 0.0)))
        self.node_peak_rss[node] = int(meta.get("peak_rss", 0))
        return meta, tensors

    def round_metrics(self, node_ids: list[int]) -> dict[str, object]:
        """Since the last round ended: each node worker's CPU seconds and peak memory, the bytes of every
        Message by operation and direction (``comm/wire_*``, as serialised), the requests and their times."""
        spent = [self.node_cpu.get(n, 0.0) - self._cpu_reported.get(n, 0.0) for n in node_ids]
        self._cpu_reported = dict(self.node_cpu)
        out: dict[str, object] = {"time/node_cpu_s": spent, "time/nodes_cpu_s": sum(spent),
                                  "memory/node_peak_rss_bytes": [self.node_peak_rss.get(n, 0) for n in node_ids]}
        for direction in ("up", "down"):
            out[f"comm/wire_{direction}_bytes"] = sum(v for k, v in self.wire.items() if k.endswith(direction))
            out[f"comm/wire_{direction}_bytes_total"] = self.wire_total[direction]
        out.update({f"comm/wire/{k}": v for k, v in self.wire.items()})
        out["comm/exchanges"] = len(self.exchanges)  # requests to the nodes (each: one Message per node)
        out["time/exchange_s"] = list(self.exchanges)  # each request's wall time, replies included
        out["comm/messages"], self.messages = self.messages, 0  # one per node and request
        out["comm/pulls"], self.pulls = self.pulls, 0  # the ServerApp's asks for replies
        self.wire.clear()
        self.exchanges.clear()
        return out

    def lose(self, nodes: list[int], why: str) -> None:
        for node in nodes:
            self.lost.add(node)
            warnings.warn(f"FlowerExecutor: node {node} is lost ({why}); its clients {self.clients_of(node)} are "
                          "dropouts from now on")
