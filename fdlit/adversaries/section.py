"""The ``adversaries`` section: which clients attack, with which attack, and what that does to the run.

Attackers are ``count`` clients, a ``fraction`` of the M clients (rounded to the nearest count), or
the listed ``ids``; drawn once from the seed (``redraw: false``) or anew every round from (seed,
round) (``redraw: true``). Every draw is a function of the seed and the round alone (its own numpy
generator), so a resumed run has the same attackers. Under client sampling an attacker attacks when
it is sampled and its upload arrives; with ``collude`` the attackers whose uploads arrive in a round
all send the same upload (that of the lowest attacker id among them), as colluding clients can agree.

The section changes nothing when it has no attack or no attacker: the run is exactly the run
without it. Bad settings are refused before any work (:meth:`Adversaries.check`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fdlit.adversaries.attacks import LAST_TEACHER, Attack
from fdlit.adversaries.client_part import AdversarialClientPart
from fdlit.adversaries.views import PartsView, PlanView
from fdlit.errors import ConfigError
from fdlit.messages import Message
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart

FIELD = "adversaries"
_DRAW = 0xAD5  # the attackers' own random stream


def attacker_count(count: int | None, fraction: float | None, ids: list[int] | None, num_clients: int) -> int:
    """How many of ``num_clients`` clients attack, from the section's count, fraction or ids."""
    if ids is not None:
        return len(ids)
    if fraction is not None:
        return int(round(fraction * num_clients))
    return int(count or 0)


class Attackers:
    """Who attacks in a round (settings only: shipped with the client part to where clients live)."""

    def __init__(self, fixed: frozenset[int] | None, count: int, num_clients: int, seed: int):
        self.fixed, self.count, self.num_clients, self.seed = fixed, count, num_clients, seed

    def of_round(self, r: int) -> frozenset[int]:
        if self.fixed is not None:
            return self.fixed
        rng = np.random.default_rng([self.seed, _DRAW, r])
        return frozenset(int(i) for i in rng.choice(self.num_clients, self.count, replace=False))

    def attacks(self, client_id: int, r: int) -> bool:
        return client_id in self.of_round(r)

    def may_attack(self, client_id: int) -> bool:
        """Whether the client attacks in some round (every client may, when redrawn)."""
        return self.fixed is None or client_id in self.fixed


class Adversaries:
    """Adversarial clients (docs/adversaries.md).

    Args:
        attack: what the attackers do, by class path (``fdlit.adversaries.LabelFlipping``,
            ``RandomPredictions``, ``ConfidentWrong``, ``ScaledLogits``, ``FreeRider``,
            ``FabricatedDensity``, ``ScaledUpdate``, ``SignFlippedUpdate``, or a class of your own
            subclassing ``fdlit.adversaries.Attack``). null: no attackers.
        count: how many clients attack (0 <= count <= M).
        fraction: the share of clients that attack, in [0, 1]: round(fraction * M) clients.
        ids: the attacking clients' ids. Set one of count, fraction and ids.
        redraw: draw the attackers anew every round (from the seed and the round) instead of once.
        collude: the attackers of a round send the same upload.
    """

    def __init__(self, attack: Attack | None = None, count: int | None = None, fraction: float | None = None,
                 ids: list[int] | None = None, redraw: bool = False, collude: bool = False):
        given = [name for name, v in (("count", count), ("fraction", fraction), ("ids", ids)) if v is not None]
        if len(given) > 1:
            raise ConfigError(f"{FIELD}.{given[1]}", f"set one of count, fraction and ids; got {' and '.join(given)}")
        if attack is not None and not isinstance(attack, Attack):
            raise ConfigError(f"{FIELD}.attack", f"must be an fdlit.adversaries.Attack, got {type(attack).__name__}")
        if attack is not None and not given:
            raise ConfigError(f"{FIELD}.count", "an attack needs its attackers: set count, fraction or ids")
        if attack is None and given and (count or fraction or ids):
            raise ConfigError(f"{FIELD}.attack", f"{given[0]} is set but no attack: name one by class path, "
                              "e.g. fdlit.adversaries.LabelFlipping")
        if count is not None and count < 0:
            raise ConfigError(f"{FIELD}.count", f"must be >= 0, got {count}")
        if fraction is not None and not (math.isfinite(fraction) and 0 <= fraction <= 1):
            raise ConfigError(f"{FIELD}.fraction", f"must be in [0, 1], got {fraction}")
        if ids is not None and len(set(ids)) != len(ids):
            raise ConfigError(f"{FIELD}.ids", f"lists a client twice: {ids}")
        if ids is not None and redraw:
            raise ConfigError(f"{FIELD}.redraw", "the listed ids attack every round; redraw needs count or fraction")
        self.attack, self.count, self.fraction, self.ids = attack, count, fraction, ids
        self.redraw, self.collude = redraw, collude
        self.attackers: Attackers | None = None
        self._flipped: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def number(self, num_clients: int) -> int:
        return attacker_count(self.count, self.fraction, self.ids, num_clients)

    def active(self, num_clients: int) -> bool:
        return self.attack is not None and self.number(num_clients) > 0

    # ------------------------------------------------------------------ before any work
    def check(self, method: Aggregator, mode: str, num_clients: int | None, num_classes: int | None) -> None:
        """Refuse attackers the federation cannot have, or an attack the method cannot suffer."""
        if self.attack is None:
            return
        if num_clients is not None:
            if self.number(num_clients) > num_clients:
                raise ConfigError(f"{FIELD}.count", f"{self.number(num_clients)} attackers but only {num_clients} "
                                  f"clients (data.num_clients); allowed: 0 to {num_clients}")
            bad = [i for i in self.ids or () if not 0 <= i < num_clients]
            if bad:
                raise ConfigError(f"{FIELD}.ids", f"no client {bad[0]}: client ids are 0 to {num_clients - 1}")
        if mode == "reference" and self.number(num_clients or 0) > 0:
            raise ConfigError(f"{FIELD}.attack", "the reference baseline is one pooled model: nobody to attack; "
                              "allowed modes: fd, local_only")
        if mode == "local_only" and type(self.attack).labels is Attack.labels:
            raise ConfigError(f"{FIELD}.attack", f"{type(self.attack).__name__} poisons uploads, and local_only sends "
                              "none; allowed there: attacks on the private set (fdlit.adversaries.LabelFlipping)")
        if mode == "fd":
            self.attack.check(method, num_classes)

    # ------------------------------------------------------------------ set-up
    def wrap(self, part: ClientPart, exchange: str, num_clients: int, seed: int) -> ClientPart:
        """The client part every client runs: ``part``, with the attack on the attackers' uploads."""
        if not self.active(num_clients):
            return part
        k = self.number(num_clients)
        if k > num_clients:
            raise ConfigError(f"{FIELD}.count", f"{k} attackers but only {num_clients} clients")
        fixed = None
        if self.ids is not None:
            fixed = frozenset(self.ids)
        elif not self.redraw:
            fixed = frozenset(int(i) for i in np.random.default_rng([seed, _DRAW]).choice(num_clients, k, replace=False))
        self.attackers = Attackers(fixed, k, num_clients, seed)
        return AdversarialClientPart(part, self.attack, self.attackers, exchange)

    # ------------------------------------------------------------------ the round (driver side)
    def of_round(self, r: int) -> frozenset[int]:
        return frozenset() if self.attackers is None else self.attackers.of_round(r)

    def private_sets(self, r: int, private: list[tuple[torch.Tensor, torch.Tensor]], num_classes: int
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The private sets the clients train on in round r: the attackers' labels poisoned."""
        if self.attackers is None or type(self.attack).labels is Attack.labels:
            return private
        out = list(private)
        for i in self.of_round(r):
            if i not in self._flipped:  # the same tensors every round (executors cache by identity)
                x, y = private[i]
                self._flipped[i] = (x, self.attack.labels(y, num_classes))
            out[i] = self._flipped[i]
        return out

    def collude_uploads(self, r: int, ids: list[int], payloads: list[Message]) -> list[Message | dict[str, torch.Tensor]]:
        """With ``collude``: every attacker among ``ids`` sends the first attacker's upload."""
        if not self.collude or self.attackers is None:
            return payloads
        attacking = [j for j, i in enumerate(ids) if i in self.of_round(r)]
        if len(attacking) < 2:
            return payloads
        shared = payloads[attacking[0]]
        return [dict(shared) if j in attacking else p for j, p in enumerate(payloads)]

    def after_round(self, parts: PartsView, plan: PlanView, result: AggregationResult | None,
                    after_public: dict[str, torch.Tensor] | None) -> dict[str, float]:
        """Keep what the free-rider sends back next round, and the round's attack metrics
        (``parts``: the federation's RoundParts; ``after_public``: every client's accuracies after
        the exchange, None when the round does not evaluate)."""
        if self.attackers is None:
            return {}
        if self.attack.needs_teacher and result is not None and result.teacher is not None:
            self._remember_teacher(parts.server.received, len(parts.tensors.public_x), plan.public_index,
                                   result.teacher)
        from fdlit.adversaries.metrics import attack_metrics

        return attack_metrics(parts, self.of_round(plan.round), self.attack, plan, result, after_public)

    @staticmethod
    def _remember_teacher(received: dict[str, torch.Tensor], public_size: int, public_index: torch.Tensor | None,
                          teacher: torch.Tensor) -> None:
        full = received.get(LAST_TEACHER)
        if public_index is None:
            full = teacher.detach().clone()
        else:
            if full is None:
                full = torch.full((public_size, teacher.shape[-1]), 1.0 / teacher.shape[-1], device=teacher.device)
            full = full.clone()
            full[public_index.to(full.device)] = teacher.detach()
        received[LAST_TEACHER] = full  # in the checkpoint with the set-up broadcast: resumes exactly
