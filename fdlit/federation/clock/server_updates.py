"""How the server updates the global model from asynchronous parameter uploads (a parameter exchange,
FedAvg's family, under an :class:`~fdlit.federation.clock.AsynchronousClock`): FedBuff's buffered
deltas or FedAsync's mixing.

Notation: x_t is the server's model after t updates (x_0 the initial model); client i uploads x_i,
trained from the model x_{tau_i} it last received; its staleness is s_i = t - tau_i (server updates
since its base) and its factor f(s_i) one of FedAsync's staleness functions
(:mod:`fdlit.federation.clock.staleness`, f(0) = 1). The clock's ``buffer`` is how many uploads one
update takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from fdlit.errors import ConfigError

FIELD = "federation.clock.server_update"

Rule = Callable[[list[torch.Tensor]], torch.Tensor]  # the method's aggregation of flat vectors


class ServerUpdate:
    """One server update from the uploads of one release."""

    def check(self, method, buffer: int | None, period: float | None) -> None:
        """Refuse, from the config alone, a method or schedule this update cannot run."""
        from fdlit.methods import FedAvg, FedMedian, FedProx, FedTrimmedMean

        if type(method) not in (FedAvg, FedProx, FedMedian, FedTrimmedMean):
            raise ConfigError("federation.clock", f"{type(method).__name__} is not a rule of FedAvg's family that "
                              "keeps no server state across rounds; allowed with AsynchronousClock and a parameter "
                              "exchange: FedAvg, FedProx, FedMedian, FedTrimmedMean")

    def step(self, current: torch.Tensor, uploads: Sequence[torch.Tensor], bases: Sequence[torch.Tensor],
             staleness: Sequence[int], factors: Sequence[float], rule: Rule) -> torch.Tensor:
        """The new global model x_{t+1} from x_t (``current``), the uploads x_i, their bases x_{tau_i},
        staleness s_i and factors f(s_i); ``rule`` is the method's aggregation of flat vectors."""
        raise NotImplementedError


class FedBuff(ServerUpdate):
    """FedBuff (Nguyen et al. 2022, *Federated Learning with Buffered Asynchronous Aggregation*,
    Algorithm 1): the server buffers the deltas Delta_i = x_i - x_{tau_i} of K arrivals (K: the
    clock's ``buffer``; K = 10 as FedBuff's setting is commonly given), each scaled by its staleness factor
    (FedBuff's is 1 / sqrt(1 + s), ``Polynomial(a=0.5)``), and then steps

        x_{t+1} = x_t + eta_g * A({f(s_i) Delta_i})

    A is the method's rule over the buffer (FedAvg: the n_k-weighted mean, FedBuff's mean when the
    clients hold equal shares of data; FedMedian: the coordinate-wise median). When every buffered
    upload was trained from x_t (every s_i = 0) and eta_g = 1, x_t + A({x_i - x_t}) is A({x_i})
    (every rule allowed is translation-equivariant): the rule's own result is used as it is, so with
    equal devices and a buffer of every client each update is a synchronous FedAvg round to the bit.

    Args:
        server_lr: eta_g, the server learning rate (1.0, as commonly given for FedBuff: the plain step of
            the deltas' mean).
    """

    def __init__(self, server_lr: float = 1.0):
        if not (isinstance(server_lr, (int, float)) and math.isfinite(server_lr) and server_lr > 0):
            raise ConfigError(f"{FIELD}.server_lr", f"allowed: a number > 0; got {server_lr!r}")
        self.server_lr = float(server_lr)

    def step(self, current, uploads, bases, staleness, factors, rule):
        if self.server_lr == 1.0 and not any(staleness):
            return rule(list(uploads))
        deltas = [f * (x - base.to(x)) for x, base, f in zip(uploads, bases, factors, strict=True)]
        step = rule(deltas)
        return current.to(step) + self.server_lr * step


class FedAsync(ServerUpdate):
    """FedAsync (Xie, Koyejo, Gupta 2019, *Asynchronous Federated Optimization*, Algorithm 1): at each
    arrival the server mixes the new model into its own,

        x_{t+1} = (1 - alpha_t) x_t + alpha_t x_i,   alpha_t = alpha * f(s_i)

    and the client then trains from x_{t+1}. One model at a time: the clock's ``buffer`` is 1. The
    paper's clients minimise f_i(x) + (rho / 2) ||x - x_t||^2: FedProx's proximal term (``mu`` = rho).

    Args:
        alpha: the mixing hyperparameter in (0, 1] (0.6, as the value of Xie et al.'s experiments is
            commonly given).
    """

    def __init__(self, alpha: float = 0.6):
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and 0 < alpha <= 1):
            raise ConfigError(f"{FIELD}.alpha", f"allowed: a number in (0, 1]; got {alpha!r}")
        self.alpha = float(alpha)

    def check(self, method, buffer, period):
        from fdlit.methods import FedAvg, FedProx

        if type(method) not in (FedAvg, FedProx):
            raise ConfigError(FIELD, f"FedAsync mixes one client's model at a time, so {type(method).__name__}'s "
                              "rule would never run; allowed with FedAsync: FedAvg, FedProx (or FedBuff)")
        if buffer != 1:
            raise ConfigError("federation.clock.buffer", "allowed: 1 with FedAsync (the server mixes each model as "
                              f"it arrives); got {buffer if period is None else f'period {period}'}")

    def step(self, current, uploads, bases, staleness, factors, rule):
        x = current
        for x_i, f in zip(uploads, factors, strict=True):
            a = self.alpha * f
            x = (1 - a) * x.to(x_i) + a * x_i
        return x
