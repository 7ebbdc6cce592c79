"""A softmax over the clients under secure aggregation, exact for any range of scores.

A rule whose teacher is P(x) = sum_i softmax_i(y_i(x)) q_i(x) (e.g. y_i = tau l_i,
a client's scaled log-density of the sample) is a ratio of two sums, sum_i e^{y_i - S} q_i / sum_i e^{y_i - S}, for any
shift S(x) the clients share. The shift must sit near max_i y_i(x): above it, so that no weight
exceeds 1 (no overflow), and not far above, so that the largest weight keeps its precision in fixed
point. With a fixed S (a bound on every y_i) the weights of a sample that every client scores low
round to 0; so the shift is agreed per sample in a first masked exchange that reveals only a coarse
maximum:

1. **levels**: client i sends the thermometer code (fdlit.privacy.wide_encoding) of its level
       k_i = K - 1 - floor((T - y_i) / W), clipped to [0, K - 1]   (-1 where y_i = -inf;
                                                                   K where y_i > T or a term overflows)
   with T the rule's bound on y and W = ``WIDTH``; the secure sum gives the server k* = max_i k_i
   per sample and nothing else (not who, not how many);
2. **terms**: k* goes down to the clients; the shift is the top of level k*'s bin,
       S = T - W (K - 1 - k*),   so   y_max <= S < y_max + W   (k* >= 1),
   and client i sends w_i = e^{y_i - S} in [0, 1] and w_i q_i in wide fixed point (``LIMBS`` limbs of
   32 bits: 2^-s with s >= 109 for up to 1,000 clients and logits up to 256, so the largest weight,
   >= e^{-W}, keeps a relative precision below 1e-15).

Where k* = -1 (no client has a finite score) every client sends w_i = 1: the plain mean, as the rule
does. Where k* = 0 (every client at least W (K - 1) below T) the largest weight may be too small for
the fixed point; the server sees it in the decoded sum of weights and the run stops with one line
(``not_served``), as it does where k* = K (a score above its bound or a term above its encoding's
range): no sample ever falls back to another rule silently.
"""

from __future__ import annotations

import torch

from fdlit.errors import NumericalFault

WIDTH = 32.0  # W: a bin of levels, in units of y (nats for a log-density)
LEVELS = 32  # K: bins below the bound T; the range served exactly is T - W (K - 1) ... T, and below where
# the largest weight still keeps 1e-9 of relative precision
LIMBS = 4  # 128-bit fixed point for the weights and weighted terms
PRECISION = 1e-9  # the relative precision every served sample keeps


def level_of(y: torch.Tensor, top: float, overflow: torch.Tensor | None = None) -> torch.Tensor:
    """Step 1's k_i of the module docstring per sample (``overflow``: samples whose terms exceed their
    encoding's range, sent as level K)."""
    y = y.double()
    k = (LEVELS - 1 - torch.floor((top - y) / WIDTH)).clamp(0, LEVELS - 1)
    k = torch.where(torch.isneginf(y), torch.full_like(k, -1), k)
    bad = (y > top) | torch.isnan(y)
    if overflow is not None:
        bad = bad | overflow
    return torch.where(bad, torch.full_like(k, LEVELS), k).long()


def shift_of(maximum: torch.Tensor, top: float) -> torch.Tensor:
    """Step 2's S per sample from the maximum level (-1: no client has a score; S is then unused)."""
    return top - WIDTH * (LEVELS - 1 - maximum.double().clamp(min=0))


def weights(y: torch.Tensor, maximum: torch.Tensor, top: float) -> torch.Tensor:
    """w_i = e^{y_i - S} in [0, 1]; 1 where no client has a finite score (the plain mean)."""
    maximum = maximum.to(y.device)
    w = torch.exp((y.double() - shift_of(maximum, top).to(y.device)).clamp(max=0.0))
    return torch.where(maximum < 0, torch.ones_like(w), w)


def check_served(maximum: torch.Tensor, weight_sum: torch.Tensor, error: float, rule: str, round: int) -> None:
    """Stop the run (one line) where a sample was not served exactly: a client's score or term beyond
    its encoding (level K), or a largest weight too small for the fixed point's precision."""
    maximum = maximum.to(weight_sum.device)
    over = int((maximum >= LEVELS).sum())
    if over:
        raise NumericalFault(f"round {round}: secure aggregation: on {over} public samples a client's score or term "
                             f"exceeds the range of its encoding (a log-density above the rule's bound, or a logit "
                             f"beyond +-256), so {rule} cannot be computed exactly from masked sums")
    low = (maximum >= 0) & (weight_sum * PRECISION < error)
    if int(low.sum()):
        raise NumericalFault(f"round {round}: secure aggregation: on {int(low.sum())} public samples every client's "
                             f"scaled score is more than {WIDTH * (LEVELS - 1):g} below the rule's bound, where the "
                             f"fixed point keeps less than {PRECISION:g} relative precision, so {rule} cannot be "
                             "computed exactly from masked sums")
