"""A federation's state: what a checkpoint holds so that a resumed run continues exactly.

Client state comes from the executor (it knows where clients live: in-process, or in Ray actors);
the method's server state, the privacy accountant, the ledger and the history from the server side.
"""

from __future__ import annotations

from typing import Any


def loop_state(fed: Any) -> dict[str, Any]:
    """Tensors and plain data only."""
    return {
        "round": fed.round,
        "rounds": fed.rounds,
        "seed": fed.seed,
        "num_clients": len(fed.clients),
        "clients": fed.executor.fetch_states(fed.clients),
        "method": fed.aggregator.state_dict(),
        "privacy": fed.privacy.state_dict(),  # the accountant: a resumed run reports the same epsilon
        "received": dict(fed.received),
        "ledger": fed.ledger.state_dict(),
        "history": [dict(m) for m in fed.history],
        "wall_time": float(fed.wall_time),
        "server": fed.server.state_dict() if fed.server is not None else None,
    }


def load_loop_state(fed: Any, state: dict[str, Any]) -> None:
    """Continue from ``state`` (the loop is set up, before ``fit``)."""
    for client, client_state in zip(fed.clients, state["clients"], strict=True):
        client.load_client_state(client_state)
    fed.executor.push_states(fed.clients)
    fed.aggregator.load_state_dict(state["method"] or {})
    fed.privacy.load_state_dict(state.get("privacy") or {})
    fed.received = dict(state["received"])
    fed.ledger.load_state_dict(state["ledger"])
    fed.history = [dict(m) for m in state["history"]]
    fed.round = state["round"]
    fed.wall_time = state["wall_time"]
    if fed.server is not None:
        if state.get("server") is None:
            raise ValueError("the checkpoint holds no server model state, but the config has a server model")
        fed.server.load_state_dict(state["server"])
