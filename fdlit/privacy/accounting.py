"""Privacy accounting for client-level releases that the server sees together with their sender.

In fdlit the server knows which clients took part in a round (under the local threat model it
receives each client's noised upload; under secure aggregation it still learns who joined the sum).
Amplification by subsampling (Balle et al. 2018; Mironov et al. 2019, the sampled Gaussian
mechanism behind Opacus's ``sample_rate``) needs the participation to stay hidden, so it does not
apply. Two valid accounts remain, both computed here:

* **Per client (reported as ``privacy/epsilon``)**: participation is drawn without looking at any
  data, so each client's guarantee is the composition of the full Gaussian release (noise multiplier
  sigma) over the rounds it actually took part in; ``privacy/epsilon`` is the largest over the
  clients, from Opacus's RDP or PRV accountant at sample rate 1.
* **Before sampling (``privacy/epsilon_sampled``, logged when q < 1)**: one round releases nothing
  about a client with probability 1 - q and the Gaussian release with probability q, a mixture whose
  Renyi divergence of order alpha (Mironov 2017) is

      eps_round(alpha) = log(1 - q + q exp((alpha - 1) alpha / (2 sigma^2))) / (alpha - 1),

  composed over the rounds and converted to (epsilon, delta) with Opacus's ``get_privacy_spent`` on
  Opacus's default orders. It is what every client is promised before the participation is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np


def orders() -> np.ndarray:
    from opacus.accountants import RDPAccountant  # imported only when DP is on

    return np.array(RDPAccountant.DEFAULT_ALPHAS, dtype=float)


def sampled_release_rdp(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """eps_round(alpha) of the module docstring, for every order (log-sum-exp: no overflow)."""
    gaussian = (alphas - 1) * alphas / (2 * sigma**2)
    if q >= 1:
        return gaussian / (alphas - 1)
    return np.logaddexp(math.log1p(-q), math.log(q) + gaussian) / (alphas - 1)


def sampled_epsilon(history: Iterable[tuple[float, float, int]], delta: float) -> float:
    """(epsilon at delta) of rounds (sigma, q, rounds) seen with their sender (module docstring)."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    alphas = orders()
    rdp = sum((steps * sampled_release_rdp(q, sigma, alphas) for sigma, q, steps in history), np.zeros_like(alphas))
    if not rdp.any():
        return 0.0
    return float(get_privacy_spent(orders=alphas, rdp=rdp, delta=delta)[0])


def make_accountant(kind: str, history: list | None = None):
    """An Opacus accountant, with ``history`` ((noise multiplier, sample rate, steps) entries) restored."""
    from opacus.accountants import PRVAccountant, RDPAccountant  # imported only when DP is on

    accountant = RDPAccountant() if kind == "rdp" else PRVAccountant()
    accountant.history = [tuple(h) for h in (history or [])]
    return accountant


def stepped(history: list, sigma: float, q: float) -> list[tuple[float, float, int]]:
    """``history`` ((sigma, q, steps) entries) with one more round."""
    history = list(history)
    if history and tuple(history[-1][:2]) == (sigma, q):
        history[-1] = (sigma, q, history[-1][2] + 1)
    else:
        history.append((sigma, q, 1))
    return history


class ClientAccountant:
    """Both accounts of the module docstring: the rounds each client took part in (its Gaussian
    releases) and the rounds with their sampling rate."""

    def __init__(self, kind: str, delta: float):
        self.kind, self.delta = kind, delta
        self.rounds: list[tuple[float, float, int]] = []  # (sigma, q, rounds), every round
        self.clients: dict[int, list[tuple[float, float, int]]] = {}  # (sigma, 1.0, rounds) a client took part in
        self.prior: list[tuple[float, float, int]] = []  # what every client starts from (an old checkpoint's rounds)
        self._cache: dict[tuple, float] = {}

    def step(self, sigma: float, q: float, clients: Iterable[int]) -> None:
        self.rounds = stepped(self.rounds, sigma, float(q))
        for i in clients:
            self.clients[int(i)] = stepped(self.clients.get(int(i), self.prior), sigma, 1.0)

    def composed(self, history: list) -> float:
        """epsilon of Gaussian releases composed (Opacus's accountant at sample rate 1)."""
        key = tuple(map(tuple, history))
        if key not in self._cache:
            self._cache[key] = float(make_accountant(self.kind, history).get_epsilon(self.delta)) if history else 0.0
        return self._cache[key]

    def epsilon(self) -> float:
        """The largest per-client epsilon (privacy/epsilon)."""
        return max((self.composed(h) for h in [self.prior, *self.clients.values()]), default=0.0)

    def epsilon_sampled(self) -> float:
        return sampled_epsilon(self.rounds, self.delta)

    def epsilon_after_next(self, sigma: float) -> float:
        """privacy/epsilon after one more round in the worst case (every client takes part)."""
        histories = [self.prior, *self.clients.values()]
        return max(self.composed(stepped(h, sigma, 1.0)) for h in histories)

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.rounds], "prior": [list(h) for h in self.prior],
                "clients": {str(i): [list(h) for h in hist] for i, hist in self.clients.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = [tuple(h) for h in state.get("history", [])]
        self.clients = {int(i): [tuple(h) for h in hist] for i, hist in state.get("clients", {}).items()}
        if "clients" in state:
            self.prior = [tuple(h) for h in state.get("prior", [])]
        else:  # a checkpoint without per-client rounds: every client counted in every round (an upper bound)
            self.prior = [(s, 1.0, n) for s, _, n in self.rounds]
