"""What the server's privacy step is told about one round's uploads (``UploadPrivacy.receive``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class UploadRound:
    """One round's uploads as the server receives them.

    ``clients``: the ids whose uploads arrived, in the order of the messages; ``num_rows``: the public
    rows each upload covers; ``sample_rate``: the round's q (logged, and the before-sampling account's
    rate); ``send(r, client, message)``: the ledger's count of what came up; ``seed``: the run's, for
    the secure sum's noise stream. Under secure aggregation ``sampled`` are the clients of the key
    exchange (default: ``clients``), ``send_down`` counts what the server sends them, and ``masking``
    runs the clients' half where they live and returns the sums (a deployment's nodes; None: here)."""

    round: int
    clients: Sequence[int]
    num_classes: int
    num_rows: int
    sample_rate: float
    send: Callable
    seed: int = 0
    sampled: Sequence[int] | None = None
    send_down: Callable | None = None
    masking: Callable | None = None
