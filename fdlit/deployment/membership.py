"""Which SuperNode hosts which clients, and what a node tells the server about its own clients."""

from __future__ import annotations

import itertools
from typing import Any

from fdlit.deployment.messages import NodeFailure


def assign_order(hello: dict[int, tuple[dict, dict]]) -> list[int]:
    """The nodes in the order they take the clients: by ``partition-id`` when every node has one
    (node_config), else by node id. Partition ids must be 0..N-1, each once."""
    parts = {node: meta.get("partition_id") for node, (meta, _) in hello.items()}
    if any(p is None for p in parts.values()):
        return sorted(parts)
    if sorted(parts.values()) != list(range(len(parts))):
        raise NodeFailure(f"the SuperNodes' partition-id values {sorted(parts.values())} are not 0..{len(parts) - 1}, "
                          "each once (flower-supernode --node-config \"partition-id=<i>\")")
    return sorted(parts, key=parts.get)


def client_blocks(client_ids: list[int], node_ids: list[int]) -> dict[int, list[int]]:
    """The clients split into contiguous blocks over the nodes, in the nodes' order (20 on 3: 0-6, 7-13, 14-19)."""
    if len(client_ids) < len(node_ids):
        raise NodeFailure(f"{len(node_ids)} SuperNodes for {len(client_ids)} clients: use at most one node per client")
    base, extra = divmod(len(client_ids), len(node_ids))
    bounds = list(itertools.accumulate([0] + [base + (p < extra) for p in range(len(node_ids))]))
    return {n: client_ids[bounds[p]:bounds[p + 1]] for p, n in enumerate(node_ids)}


def apply_local_classes(loop: Any, replies: dict) -> None:
    """Clients of a node with its own data (``local-data``) hold the classes the node reports at set-up:
    the server measures their local accuracy on those, and the server part knows them as it knows the
    others' (``ServerContext.client_classes``)."""
    reported = {int(i): list(c) for meta, _ in replies.values() for i, c in meta.get("classes", {}).items()}
    if not reported:
        return
    masks, side = loop.parts.tensors.local_masks, loop.parts.clients
    for i, classes in reported.items():
        side.clients[i].classes = classes
        side.client_data[i].classes = classes
        masks[i] = loop.data.local_test_mask(classes).to(masks)
    loop.parts.facts.client_classes = tuple(tuple(cd.classes) for cd in side.client_data)
