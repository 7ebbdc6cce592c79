"""Staleness functions and how they weigh the cached rows of a teacher.

Staleness of client i's cached upload at release k (the k-th teacher): ``s_i = k - 1 - v_i``, where
v_i is the release whose teacher client i's model had last distilled from when it made the upload
(0: none yet). In synchronous rounds every upload is made right after the previous teacher, so
s_i = 0 for everyone.

The functions are FedAsync's (Xie et al. 2019, FedAsync, Sec. 5.2), of the staleness t - tau:

* constant:   f(s) = 1
* polynomial: f(s) = (s + 1) ** (-a)
* hinge:      f(s) = 1 if s <= b else 1 / (a * (s - b) + 1)

Every function has f(0) = 1.
"""

from __future__ import annotations

import math

import torch

from fdlit.errors import ConfigError

FIELD = "federation.clock.staleness"


class Staleness:
    """f(s), the weight of an upload ``s`` releases stale (s >= 0)."""

    constant = False  # True: f is 1 everywhere, so every rule takes cached rows unweighted

    def __call__(self, s: int) -> float:
        raise NotImplementedError


class Constant(Staleness):
    """f(s) = 1 (FedAsync's constant function)."""

    constant = True

    def __call__(self, s):
        return 1.0


class Polynomial(Staleness):
    """f(s) = (s + 1) ** (-a) (FedAsync's polynomial function, Xie et al. 2019).

    Args:
        a: the decay exponent, >= 0 (0: constant).
    """

    def __init__(self, a: float = 0.5):
        if not (math.isfinite(a) and a >= 0):
            raise ConfigError(f"{FIELD}.a", f"allowed: a number >= 0; got {a}")
        self.a = float(a)

    def __call__(self, s):
        return float((s + 1) ** (-self.a))


class Hinge(Staleness):
    """f(s) = 1 for s <= b, else 1 / (a (s - b) + 1) (FedAsync's hinge function, Xie et al. 2019).

    Args:
        a: the decay slope after the hinge, >= 0.
        b: the staleness tolerated at full weight, >= 0.
    """

    def __init__(self, a: float = 10.0, b: float = 4.0):
        if not (math.isfinite(a) and a >= 0):
            raise ConfigError(f"{FIELD}.a", f"allowed: a number >= 0; got {a}")
        if not (math.isfinite(b) and b >= 0):
            raise ConfigError(f"{FIELD}.b", f"allowed: a number >= 0; got {b}")
        self.a, self.b = float(a), float(b)

    def __call__(self, s):
        return 1.0 if s <= self.b else float(1.0 / (self.a * (s - self.b) + 1.0))


def staleness_weighted(weights: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """A rule's M x N weights W times each client's staleness factor f_i, renormalised per sample:

        W'[i, x] = W[i, x] f_i / sum_j W[j, x] f_j

    A sample whose every weighted entry is 0 keeps W's column (the rule's own weights)."""
    scaled = weights * factors.to(weights)[:, None]
    total = scaled.sum(0, keepdim=True)
    return torch.where(total > 0, scaled / total.clamp_min(torch.finfo(scaled.dtype).tiny), weights)


def mixture_of(method) -> str | None:
    """Which mixture the rule's teacher is: ``probabilities`` (P = sum_i W_i softmax(z_i): AVG, entropy
    weighting, UWA, sUWA), ``logits`` (P = softmax(sum_i W_i z_i): UWA, sUWA with ``mixing: logits``),
    ``sharpened`` (P = softmax(sum_i W_i softmax(z_i) / T): ERA); None: none of them."""
    from fdlit.methods.averaging import ProbabilityAveraging
    from fdlit.methods.entropy import EntropyWeighted
    from fdlit.methods.era import EntropyReduction
    from fdlit.methods.uncertainty import UncertaintyWeighted

    if isinstance(method, EntropyReduction):
        return "sharpened"
    if isinstance(method, UncertaintyWeighted):
        return method.mixing
    return "probabilities" if isinstance(method, (ProbabilityAveraging, EntropyWeighted)) else None


def stale_teacher(method, weights: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The rule's mixture (:func:`mixture_of`) of the M x N x C ``logits`` under the M x N ``weights``."""
    kind = mixture_of(method)
    if kind == "logits":
        return torch.einsum("mn,mnc->nc", weights, logits).softmax(-1)
    mixed = torch.einsum("mn,mnc->nc", weights, logits.softmax(-1))
    return torch.softmax(mixed / method.temperature, -1) if kind == "sharpened" else mixed
