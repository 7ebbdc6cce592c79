"""The round's facts: who takes part, on which public rows, what every party knows, when to evaluate.

All of it is a function of (seed, round) and the config, so a resumed run draws the same
participants and evaluates the same rounds (docs/participation.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fdlit.methods.base import FederationInfo, ServerContext


@dataclass(frozen=True)
class RoundPlan:
    """Round r: the sampled and arrived client ids, the public rows (None: all), whether the
    clients are evaluated and on which test rows (None: all)."""

    round: int
    sampled: list[int]
    arrived: list[int]
    public_index: torch.Tensor | None
    evaluated: bool
    eval_rows: torch.Tensor | None

    @property
    def first(self) -> bool:
        return self.round == 1


class RoundFacts:
    """What every party of the federation knows, round by round.

    Args:
        participation: a :class:`~fdlit.federation.participation.Participation`, or None (every
            client and the whole public set every round).
        epochs: (first round, later rounds) private-phase epochs, told to client parts.
    """

    def __init__(self, seed: int, rounds: int, num_clients: int, num_classes: int, public_x: torch.Tensor,
                 public_y: torch.Tensor, client_classes: tuple[tuple[int, ...], ...], participation,
                 epochs: tuple[int, int], eval_every_n_rounds: int, eval_rows: torch.Tensor | None):
        self.seed, self.rounds, self.num_clients, self.num_classes = seed, rounds, num_clients, num_classes
        self.public_x, self.public_y, self.client_classes = public_x, public_y, client_classes
        self.participation = participation
        self.epochs = epochs
        self.eval_every_n_rounds, self.eval_rows = eval_every_n_rounds, eval_rows

    @property
    def sample_rate(self) -> float:
        """Per-round sampling rate q of a client (Participation.sample_rate; 1.0: everyone, every round)."""
        return 1.0 if self.participation is None else self.participation.sample_rate

    def evaluates(self, r: int) -> bool:
        """Whether round r evaluates the clients: round 1, every n-th round and the last."""
        return r == 1 or r % self.eval_every_n_rounds == 0 or r >= self.rounds

    def participants(self, r: int) -> tuple[list[int], list[int], torch.Tensor | None]:
        """Round r's sampled and arrived client ids and public rows (None: all)."""
        everyone = list(range(self.num_clients))
        if self.participation is None:
            return everyone, everyone, None
        sampled, arrived = self.participation.draw(self.seed, r, self.num_clients)
        rows = self.participation.public_rows(self.seed, r, len(self.public_x))
        return sampled, arrived, None if rows is None else torch.as_tensor(rows, device=self.public_x.device)

    def plan(self, r: int) -> RoundPlan:
        sampled, arrived, public_index = self.participants(r)
        # intermediate rounds: every n-th only, maybe on the test subsample; the last: all of it
        return RoundPlan(r, sampled, arrived, public_index, self.evaluates(r),
                         self.eval_rows if r < self.rounds else None)

    def info(self, round: int, clients: tuple[int, ...] = (), public_index: torch.Tensor | None = None
             ) -> FederationInfo:
        epochs = 0 if round == 0 else self.epochs[0] if round == 1 else self.epochs[1]
        public_x = self.public_x if public_index is None else self.public_x[public_index]
        return FederationInfo(round, self.seed, self.num_clients, self.num_classes, public_x,
                              private_epochs=epochs, clients=clients, public_index=public_index,
                              public_size=len(self.public_x))

    def server_context(self, round: int, info: FederationInfo | None = None) -> ServerContext:
        return ServerContext(info or self.info(round), self.public_y, self.client_classes)
