"""Participation: which clients take part in a round, which uploads arrive, and which public samples are used.

The section ``federation.participation`` (all knobs are dotted flags, e.g.
``--federation.participation.fraction 0.5``) follows the client sampling of FedAvg (McMahan et al.
2017) and DS-FL (Itahara et al. 2021), the dynamic clients of F2L, and DS-FL's per-round draw of
an unlabelled public subset. Every draw of round r is a function of (seed, r) alone (its own
``numpy`` generator, no global random stream is touched), so a killed and resumed run samples the
same clients and public rows as an uninterrupted one, and no section (or fraction 1, no dropout,
no subset) leaves the run exactly as it is without participation.

Semantics, per round r (``docs/participation.md``):

* **available**: clients whose join round is <= r (``join_rounds``, or the last ``late_joiners``
  client ids joining at ``join_round``); a client that has not joined yet does nothing.
* **sampled**: ``count`` clients, or ``ceil(fraction * available)``, drawn uniformly without
  replacement from the available ones (all of them when the section asks for more than are
  available). A client not sampled does nothing this round: no private phase, no public
  inference, no upload, no teacher, no distillation; its model, optimizer state and generators
  stay untouched.
* **dropped**: each sampled client independently with probability ``dropout``. A dropped client
  trains its private phase, then disconnects before its upload: nothing of it reaches the server,
  and it neither receives this round's teacher nor distils (a straggler whose round is lost).
* **arrived**: sampled and not dropped. The aggregator sees only their uploads (its M is their
  number; ``FederationInfo.clients`` names them); the teacher goes down to them only; the ledger
  counts only what they sent and received. When no upload arrives, the round has no teacher and
  no public phase.
* **public subset**: with ``public_subset`` = N' (or ``public_fraction`` of N), the round uses N' public rows drawn without
  replacement (sorted); uploads, the teacher and distillation are on those rows
  (``FederationInfo.public_index``). The rows follow from the shared seed and the round, so no
  index travels and nothing extra is counted.

The method's set-up (round 0, e.g. the Meta-Model's pooled labelled set) is a registration every
client does once before round 1, late joiners included. Evaluation still measures every client
after each phase, whether or not it took part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fdlit.errors import ConfigError

FIELD = "federation.participation"
_SAMPLE, _DROP, _PUBLIC = 0x5A3, 0xD40, 0x9B1  # one stream per kind of draw


@dataclass
class Participation:
    """Client sampling, dropout, late joiners and a per-round public subset.

    Args:
        fraction: share of the available clients sampled each round, in (0, 1]; the sample has
            ``ceil(fraction * available)`` clients. Set fraction or count, not both.
        count: clients sampled each round, 1 <= count <= M (fewer while fewer are available).
        dropout: probability in [0, 1) that a sampled client trains but its upload never arrives
            (it then receives no teacher that round).
        join_rounds: per client (M values, each >= 1), the first round it can take part in
            (F2L's dynamic clients), at most federation.rounds. null: every client from round 1.
        late_joiners: shortcut for join_rounds: the last ``late_joiners`` client ids join at
            ``join_round``, the others at round 1.
        join_round: the round the late joiners join (>= 2 to be late; at most federation.rounds).
        public_subset: N', public samples drawn each round (1 <= N' <= N) and used for that round's
            uploads and distillation. null: the whole public set.
        public_fraction: N' as a share of the public set, in (0, 1]: N' = ceil(public_fraction * N).
            Set public_subset or public_fraction, not both.
    """

    fraction: float | None = None
    count: int | None = None
    dropout: float = 0.0
    join_rounds: list[int] | None = None
    late_joiners: int = 0
    join_round: int = 1
    public_subset: int | None = None
    public_fraction: float | None = None

    def __post_init__(self):
        self._num_clients: int | None = None  # M, known after check()
        if self.fraction is not None and self.count is not None:
            raise ConfigError(f"{FIELD}.fraction", f"set fraction or count, not both (got fraction={self.fraction}, "
                              f"count={self.count})")
        if self.fraction is not None and not (math.isfinite(self.fraction) and 0 < self.fraction <= 1):
            raise ConfigError(f"{FIELD}.fraction", f"allowed: a number in (0, 1]; got {self.fraction}")
        if self.count is not None and self.count < 1:
            raise ConfigError(f"{FIELD}.count", f"allowed: an integer in [1, num_clients]; got {self.count}")
        if not (math.isfinite(self.dropout) and 0 <= self.dropout < 1):
            raise ConfigError(f"{FIELD}.dropout", f"allowed: a probability in [0, 1); got {self.dropout}")
        if self.join_rounds is not None:
            if self.late_joiners:
                raise ConfigError(f"{FIELD}.late_joiners", "set join_rounds or late_joiners, not both")
            bad = [r for r in self.join_rounds if r < 1]
            if bad:
                raise ConfigError(f"{FIELD}.join_rounds", f"allowed: rounds >= 1 (one per client); got {bad[0]}")
        if self.late_joiners < 0:
            raise ConfigError(f"{FIELD}.late_joiners", f"allowed: an integer in [0, num_clients); "
                              f"got {self.late_joiners}")
        if self.join_round < 1:
            raise ConfigError(f"{FIELD}.join_round", f"allowed: a round >= 1; got {self.join_round}")
        if self.public_fraction is not None:
            if self.public_subset is not None:
                raise ConfigError(f"{FIELD}.public_fraction", "set public_subset or public_fraction, not both")
            if not (math.isfinite(self.public_fraction) and 0 < self.public_fraction <= 1):
                raise ConfigError(f"{FIELD}.public_fraction", f"allowed: a number in (0, 1]; got {self.public_fraction}")
        if self.public_subset is not None and self.public_subset < 1:
            raise ConfigError(f"{FIELD}.public_subset", f"allowed: an integer in [1, public size]; "
                              f"got {self.public_subset}")

    def check(self, num_clients: int, public_size: int) -> None:
        """The bounds that need the federation (called in the loop's set-up, before any training)."""
        if self.count is not None and self.count > num_clients:
            raise ConfigError(f"{FIELD}.count", f"allowed: an integer in [1, {num_clients}] (num_clients); "
                              f"got {self.count}")
        if self.join_rounds is not None and len(self.join_rounds) != num_clients:
            raise ConfigError(f"{FIELD}.join_rounds", f"needs one round per client ({num_clients} values); "
                              f"got {len(self.join_rounds)}")
        if self.late_joiners >= num_clients:
            raise ConfigError(f"{FIELD}.late_joiners", f"allowed: an integer in [0, {num_clients - 1}] "
                              f"(at least one client from round 1); got {self.late_joiners}")
        if self.public_subset is not None and self.public_subset > public_size:
            raise ConfigError(f"{FIELD}.public_subset", f"allowed: an integer in [1, {public_size}] (the public "
                              f"set's size); got {self.public_subset}")
        self._num_clients = num_clients

    def check_rounds(self, rounds: int, num_clients: int) -> None:
        """Refuse a run in which a client never takes part: its join round is after the last round
        (no client at all, or late joiners that would only count towards M)."""
        joined = self.joined(num_clients)
        field = f"{FIELD}.join_rounds" if self.join_rounds is not None else f"{FIELD}.join_round"
        if min(joined) > rounds:
            raise ConfigError(field, f"no client joins within federation.rounds = {rounds} (the first joins in "
                              f"round {min(joined)}), so nothing would train; allowed: at least one client joining in "
                              f"a round <= {rounds}")
        never = [i for i, r in enumerate(joined) if r > rounds]
        if never:
            ids = f"client {never[0]}" if len(never) == 1 else f"clients {never[0]}..{never[-1]}"
            who = (f"the late joiners ({ids}) join in round {self.join_round}" if self.join_rounds is None else
                   f"client(s) {', '.join(map(str, never[:5]))}{' ...' if len(never) > 5 else ''} join in round(s) "
                   f"{', '.join(str(joined[i]) for i in never[:5])}")
            raise ConfigError(field, f"{who}, after the last round (federation.rounds = {rounds}), so they would "
                              f"never take part; allowed: join rounds in [1, {rounds}] (or raise federation.rounds)")

    def sample_rate_for(self, num_clients: int) -> float:
        """The largest per-round probability that a given client is sampled, over the rounds (the
        q of privacy amplification by subsampling). While late joiners are missing fewer clients
        share the sample, so the rate of every distinct number of available clients is checked.
        Dropout is not counted: a dropped client still trained, and leaving it out keeps q an
        upper bound."""
        joined = self.joined(num_clients)
        rate = 0.0
        for first in sorted(set(joined)):
            available = sum(j <= first for j in joined)
            if self.count is not None:
                k = min(self.count, available)
            elif self.fraction is not None:
                k = min(available, math.ceil(self.fraction * available - 1e-9))
            else:
                k = available
            rate = max(rate, k / available)
        return rate

    @property
    def sample_rate(self) -> float:
        """Per-round sampling rate q of a client (:meth:`sample_rate_for` of the federation's M,
        known once :meth:`check` ran in the loop's set-up; 1.0 when everyone takes part)."""
        if self.count is None and self.fraction in (None, 1.0):
            return 1.0
        if self._num_clients is None:
            raise RuntimeError("Participation.sample_rate needs the number of clients: call check() or "
                               "sample_rate_for(num_clients)")
        return self.sample_rate_for(self._num_clients)

    @property
    def is_full(self) -> bool:
        """Every client, every round, every public sample: the loop runs exactly as without the section."""
        return (self.fraction in (None, 1.0) and self.count is None and self.dropout == 0
                and self.join_rounds is None and self.late_joiners == 0 and self.public_subset is None
                and self.public_fraction in (None, 1.0))

    # ------------------------------------------------------------------ the draws
    def joined(self, num_clients: int) -> list[int]:
        """Per client, its first round."""
        if self.join_rounds is not None:
            return list(self.join_rounds)
        first = num_clients - self.late_joiners
        return [1 if i < first else self.join_round for i in range(num_clients)]

    def draw(self, seed: int, r: int, num_clients: int) -> tuple[list[int], list[int]]:
        """(sampled, arrived) client ids of round r, sorted; a function of (seed, r) only."""
        joined = self.joined(num_clients)
        available = [i for i in range(num_clients) if joined[i] <= r]
        if self.count is not None:
            k = min(self.count, len(available))
        elif self.fraction is not None:
            k = min(len(available), math.ceil(self.fraction * len(available) - 1e-9))
        else:
            k = len(available)
        if k < len(available):
            rng = np.random.default_rng([seed, r, _SAMPLE])
            sampled = sorted(int(available[j]) for j in rng.choice(len(available), size=k, replace=False))
        else:
            sampled = available
        if self.dropout > 0:
            lost = np.random.default_rng([seed, r, _DROP]).random(num_clients) < self.dropout  # per client id
            arrived = [i for i in sampled if not lost[i]]
        else:
            arrived = list(sampled)
        return sampled, arrived

    def public_rows(self, seed: int, r: int, public_size: int) -> np.ndarray | None:
        """The public rows of round r (sorted), or None for all of them."""
        size = self.public_subset
        if self.public_fraction is not None:
            size = math.ceil(self.public_fraction * public_size - 1e-9)
        if size is None or size >= public_size:
            return None
        rng = np.random.default_rng([seed, r, _PUBLIC])
        return np.sort(rng.choice(public_size, size=size, replace=False))


def participation_metrics(sampled: Sequence[int], arrived: Sequence[int], public_size: int) -> dict:
    """A round's participation as the run logs it: who was sampled, who arrived, how many dropped."""
    return {"participation/clients": list(sampled), "participation/arrived": list(arrived),
            "participation/sampled_count": len(sampled), "participation/arrived_count": len(arrived),
            "participation/dropped_count": len(sampled) - len(arrived), "participation/public_size": public_size}
