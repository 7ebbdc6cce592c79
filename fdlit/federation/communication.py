"""Communication accounting: every message, in the dtype actually sent."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Literal

import torch

from fdlit.messages import array_bytes

Direction = Literal["up", "down"]


@dataclass(frozen=True)
class Message:
    round: int
    client: int
    direction: Direction  # up: client -> server, down: server -> client
    kind: str  # e.g. "logits", "gmm_means", "teacher"
    dtype: str
    shape: tuple[int, ...]
    bytes: int


FIELDS = tuple(f.name for f in fields(Message))
_values = attrgetter(*FIELDS)  # dataclasses.astuple/asdict deep-copy every field: ~10x slower


class CommunicationLedger:
    """Records messages and answers: bytes per round, per client, per kind, per direction, cumulative."""

    def __init__(self):
        self.messages: list[Message] = []

    def send(self, round: int, client: int, direction: Direction, kind: str, payload: torch.Tensor) -> torch.Tensor:
        """Count ``payload`` as sent and return it (so call sites read as sending)."""
        nbytes = array_bytes(payload)  # masks travel as bits
        self.messages.append(
            Message(round, client, direction, kind, str(payload.dtype).removeprefix("torch."), tuple(payload.shape), nbytes)
        )
        return payload

    def total(self, direction: Direction | None = None, round: int | None = None, client: int | None = None) -> int:
        return sum(
            m.bytes
            for m in self.messages
            if (direction is None or m.direction == direction)
            and (round is None or m.round == round)
            and (client is None or m.client == client)
        )

    def round_metrics(self, round: int, num_clients: int) -> dict[str, float]:
        """Per-round bytes by direction and kind, per-client mean, and cumulative totals."""
        out: dict[str, float] = defaultdict(float)
        for m in self.messages:
            if m.round == round:
                out[f"comm/{m.direction}_bytes"] += m.bytes
                out[f"comm/{m.direction}/{m.kind}"] += m.bytes
        out.setdefault("comm/up_bytes", 0.0)
        out.setdefault("comm/down_bytes", 0.0)
        out["comm/up_bytes_per_client"] = out["comm/up_bytes"] / num_clients
        out["comm/up_bytes_total"] = self.total("up")
        out["comm/down_bytes_total"] = self.total("down")
        return dict(out)

    def rows(self, start: int = 0) -> list[dict]:
        """Messages from index ``start`` on, as plain dicts (the run directory appends only new ones)."""
        return [dict(zip(FIELDS, _values(m), strict=True)) for m in self.messages[start:]]

    def state_dict(self) -> dict:
        # one list per field: the checkpoint holds every message of the run and is written every
        # round, and a list of per-message dicts made saving grow ~10x faster with the run's length
        columns = list(zip(*map(_values, self.messages), strict=True)) or [()] * len(FIELDS)
        return {"columns": {name: list(col) for name, col in zip(FIELDS, columns, strict=True)}}

    def load_state_dict(self, state: dict) -> None:
        if "columns" in state:
            columns = state["columns"]
            rows = [dict(zip(FIELDS, values, strict=True)) for values in zip(*(columns[name] for name in FIELDS), strict=True)]
        else:  # checkpoints written before the columnar format
            rows = state["messages"]
        self.messages = [Message(**{**m, "shape": tuple(m["shape"])}) for m in rows]
