"""Secure aggregation of a round's uploads: what a rule that is a sum of per-client terms receives.

A rule can be computed on masked uploads when its teacher needs only sums over the clients of terms
each client can compute from its own upload: probability averaging (the sum of the probabilities),
logit averaging (of the logits), a weighting whose weight w_i(x) client i computes from its own upload,
normalised over the clients by a softmax (the sums of w_i(x) p_i(x) and of w_i(x)), a weighted mean of
parameters (the sums of w_k theta_k and of w_k). A method declares this with two hooks:

* ``secure_summands(upload, client) -> {name: (tensor, bound)}``: on client ``client``, from its own
  upload, the terms to sum, each with a bound B on its entries (entries are clipped to [-B, B]: fixed
  point); ``(tensor, bound, limbs)`` asks for wide fixed point (fdlit.privacy.wide_encoding);
* optionally ``secure_levels = K`` and ``secure_level(upload, client)``: a first masked exchange gives
  the server the maximum over the clients of each entry's level (in -1 … K), which goes down to the
  clients, and ``secure_summands(upload, client, maximum=…)`` reads it (a softmax over the clients
  shifted per sample: fdlit.privacy.secure_softmax);
* ``aggregate_sums(sums: SecureSums, ctx) -> AggregationResult``: on the server, the teacher from the
  sums alone (no per-client weights exist there).

Every other rule (order statistics such as the coordinate median and the trimmed mean, scores from the
distances between uploads, per-sample selection of clients, weights normalised across clients by the server) needs
the individual uploads and is refused before any work, with its ``secure_refusal`` sentence (or the
general reason) in one line.

The clients' side runs in the server's process in ``fit`` (each client's terms are computed from its own
release, fixed-point encoded and masked there); the rule is given only the unmasked sum
(``SecureSums``). The protocol and its fixed-point error are fdlit.privacy.secure_sum's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fdlit.privacy.release import Declaring, stale
from fdlit.privacy.secure_sum import decode, encode, fixed_point_error, scale_bits, secure_sum
from fdlit.privacy.wide_encoding import level_words, maximum_level, wide_decode, wide_encode, wide_scale_bits


@dataclass(frozen=True)
class SecureSums:
    """What the server's rule receives under secure aggregation: the sum of every summand over the
    ``clients`` whose masked upload arrived, and the fixed-point error bound of each sum."""

    sums: dict[str, torch.Tensor]
    clients: tuple[int, ...]
    error: dict[str, float] = field(default_factory=dict)
    maximum: torch.Tensor | None = None  # the first exchange's per-sample maximum level, where the rule declares one

    @property
    def count(self) -> int:
        return len(self.clients)


def maskable(method: Declaring) -> str | None:
    """None when ``method`` can run on masked sums, else why not (one sentence)."""
    name = type(method).__name__
    if method.secure_refusal:
        return f"{name} {method.secure_refusal}"
    if not method.sums_uploads or stale(type(method), "secure_summands", "aggregate"):
        return (f"{name}'s teacher is not declared a sum of per-client terms (no ``secure_summands``/"
                "``aggregate_sums``), so the server would need the individual uploads")
    return None


@dataclass(frozen=True)
class SecureMaximum:
    """The first exchange's result: each entry's largest level over the ``clients`` that sent theirs."""

    maximum: torch.Tensor
    clients: tuple[int, ...]


def expected_bits(bound: float, clients: int, limbs: int) -> int:
    """The scale bits of a term in [-bound, bound] summed over ``clients`` clients in ``limbs`` limbs."""
    return scale_bits(bound, clients) if limbs == 1 else wide_scale_bits(bound, clients, limbs)


def flatten(summands: dict[str, tuple], clients: int
            ) -> tuple[np.ndarray, list[tuple[str, tuple[int, ...], float, int, int]]]:
    """One uint64 vector of every summand in fixed point, and its layout (name, shape, bound, scale
    bits, limbs)."""
    parts, layout = [], []
    for name in sorted(summands):
        values, bound, *wide = summands[name]
        limbs = int(wide[0]) if wide else 1
        bits = expected_bits(bound, clients, limbs)
        x = values.detach().double().cpu().numpy().ravel()
        parts.append(encode(x, bound, bits) if limbs == 1 else wide_encode(x, bound, bits, limbs))
        layout.append((name, tuple(values.shape), float(bound), bits, limbs))
    return np.concatenate(parts), layout


def masked_maximum(r: int, sampled: Sequence[int], clients: Sequence[int], levels: list[torch.Tensor], count: int,
                   send: Callable, threshold: float = 0.5) -> tuple[SecureMaximum | None, dict[str, float]]:
    """The first exchange (module docstring): every arrived client's ``levels`` (in -1 … count - 1) as a
    thermometer code, masked and summed; the server reads the largest level of each entry. None when
    fewer than t clients survived."""
    u1 = sorted(set(sampled) | set(clients))
    vectors = {i: level_words(lv.cpu().numpy(), count) for i, lv in zip(clients, levels, strict=True)}
    total, stats = secure_sum(u1, vectors, ledger_counter(r, send), round=r, fraction=threshold, stage="levels")
    if total is None:
        return None, stats
    return SecureMaximum(torch.from_numpy(maximum_level(total, count)), tuple(clients)), stats


def masked_sums(r: int, sampled: Sequence[int], clients: Sequence[int], summands: list[dict],
                send: Callable[[int, int, str, str, torch.Tensor], None], threshold: float = 0.5
                ) -> tuple[SecureSums | None, dict[str, float]]:
    """Every arrived client's ``summands`` masked and summed over the protocol, with ``sampled`` the
    clients that took part in the key exchange (those not in ``clients`` dropped after it); ``send(r,
    client, direction, kind, tensor)`` counts each message; ``threshold``: t as a fraction of the
    sampled clients. None when fewer than t clients survived."""
    u1 = sorted(set(sampled) | set(clients))
    vectors, layout = {}, []
    for i, s in zip(clients, summands, strict=True):
        vectors[i], layout = flatten(s, len(u1))
    total, stats = secure_sum(u1, vectors, ledger_counter(r, send), round=r, fraction=threshold)
    if total is None:
        return None, stats
    device = next(iter(summands[0].values()))[0].device  # the sums go where the uploads were
    return decoded_sums(total, layout, len(u1), clients, device, stats)


def ledger_counter(r: int, send: Callable[[int, int, str, str, torch.Tensor], None]):
    """The protocol's ``send(client, direction, kind, array)`` as the ledger's call for round r."""
    def count(client, direction, kind, array):
        send(r, client, direction, kind, torch.from_numpy(array.view(np.int64) if array.dtype == np.uint64 else array))
    return count


def decoded_sums(total: np.ndarray, layout: list, clients_u1: int, clients: Sequence[int], device,
                 stats: dict[str, float]) -> tuple[SecureSums, dict[str, float]]:
    """The unmasked ``total`` (``flatten``'s ``layout``, ``clients_u1`` clients in the key exchange) as
    the sums the rule receives, on ``device``."""
    sums, errors, start = {}, {}, 0
    for name, shape, _, bits, limbs in layout:
        size = int(np.prod(shape)) * limbs
        part = total[start:start + size]
        values = decode(part, bits) if limbs == 1 else wide_decode(part, bits, limbs)
        sums[name] = torch.from_numpy(values.reshape(shape)).to(device)
        errors[name] = fixed_point_error(clients_u1, bits)
        start += size
    stats["secagg/scale_bits_min"] = float(min(bits for *_, bits, _ in layout))
    stats["secagg/fixed_point_error_max"] = max(errors.values())
    return SecureSums(sums, tuple(clients), errors), stats


PARAMETER_BOUND = 2.0**8  # exchanged parameters are clipped to +-256 in the secure sum
LOGIT_BOUND = 2.0**8  # logits are clipped to +-256 in the secure sum (where float32 softmax is one-hot already)


def probability_rows(mean: torch.Tensor) -> torch.Tensor:
    """A decoded mean of probabilities back on the simplex (the fixed-point error can leave an entry a
    hair below 0); a row of zeros becomes uniform."""
    p = mean.double().clamp_min(0)
    total = p.sum(-1, keepdim=True)
    return torch.where(total > 0, p / total.clamp_min(1e-300), torch.full_like(p, 1 / p.shape[-1])).float()
