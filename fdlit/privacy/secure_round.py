"""One round of secure aggregation as the server's privacy layer runs it (``UploadPrivacy.receive``).

* **A sum rule** (fdlit.privacy.secure_upload): each arrived client's terms are masked and summed; a
  rule that declares ``secure_levels`` (a softmax over the clients, fdlit.privacy.secure_softmax) first
  gets the per-sample maximum level in a masked exchange of its own (fresh keys and masks), which goes
  down to the clients (``secagg_shift``), then the terms that read it.
* **Central differential privacy, distributed** (Kairouz et al. 2021, *The distributed discrete
  Gaussian mechanism for federated learning with secure aggregation*, here with continuous Gaussian
  shares): each of the n clients of the key exchange adds its own share of the noise to its clipped
  rows before masking,

      x_i + N(0, (sigma Delta)^2 / n I),    Delta = 2 c sqrt(R),

  so the server only ever decodes a noisy sum. With all n clients' shares in the sum it carries
  N(0, (sigma Delta)^2 I), the central mechanism; when only m < n clients survive, only m shares do:
  noise multiplier sigma sqrt(m / n), which the accountant charges for that round (less noise, larger
  epsilon). The fixed point rounds each noisy term to 2^-s (s >= 40 here, far below the noise); the
  accountant treats the sum as the continuous Gaussian mechanism (Kairouz et al.'s discrete Gaussian
  would make the rounding part of the analysis).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from fdlit.privacy.client_release import gaussian_noise
from fdlit.privacy.secure_sum import EXCHANGES
from fdlit.privacy.secure_upload import SecureSums, masked_maximum, masked_sums

NOISE_STREAM = 0xCE  # the random stream of a client's share of the central noise
TAIL = 40.0  # a noisy term is encoded within c + TAIL share stds (a Gaussian beyond it: p < 1e-340)


def share_std(noise_multiplier: float, clip_norm: float, rows: int, clients: int) -> float:
    """One client's share of the central noise: sigma Delta / sqrt(n), Delta = 2 c sqrt(R)."""
    return noise_multiplier * 2 * clip_norm * math.sqrt(rows) / math.sqrt(max(clients, 1))


def noisy_rows(rows: torch.Tensor, r: int, client: int, seed: int, noise_multiplier: float, clip_norm: float,
               clients: int) -> dict[str, tuple[torch.Tensor, float]]:
    """A client's term of the central sum: its clipped rows plus its share of the noise (module docstring),
    drawn from its own stream per (seed, round, client)."""
    rows = rows.double()
    std = share_std(noise_multiplier, clip_norm, len(rows), clients)
    noise = gaussian_noise(rows.shape, r, client, seed, std, rows.device, stream=NOISE_STREAM)
    return {"logits": (rows + noise, clip_norm + TAIL * std)}


def merged(first: dict[str, float], second: dict[str, float], clients: int, survivors: int) -> dict[str, float]:
    """Two aggregations' stats as one round's: its clients, every drop-out across both, the time of both."""
    out = dict(second)
    out.update({"secagg/clients": float(clients), "secagg/threshold": first["secagg/threshold"],
                "secagg/dropped_after_sharing": float(clients - survivors), "secagg/survivors": float(survivors),
                "secagg/extra_exchanges": float(2 * EXCHANGES),
                "time/secagg_s": first.get("time/secagg_s", 0.0) + second.get("time/secagg_s", 0.0)})
    return out


def masked_round(privacy, r: int, sampled: Sequence[int], ids: Sequence[int], messages: list, count: Callable,
                 masking: Callable | None, seed: int) -> tuple[SecureSums | None, dict[str, float]]:
    """The round's sums (None: too few survived) and its ``secagg/*`` stats; ``masking``: the clients'
    half where they live (a deployment), else here from ``messages``."""
    threshold, levels = privacy.secure_threshold, privacy.secure_levels
    u1 = sorted(set(sampled) | set(ids))
    by_id = dict(zip(ids, messages, strict=True))
    maximum, first = None, {}
    if levels:
        if masking is not None:
            maximum, first = masking(r, u1, ids, threshold, count, stage="levels")
        else:
            ranks = [privacy.secure_level(by_id[i], i) for i in ids]
            maximum, first = masked_maximum(r, u1, ids, ranks, levels, count, threshold)
        if maximum is None:
            return None, first
        for i in maximum.clients:  # what the second exchange reads, sent to the clients that remain
            count(r, i, "down", "secagg_shift", maximum.maximum.to(torch.int16))
        ids = [i for i in ids if i in maximum.clients]
    if masking is not None:
        sums, stats = masking(r, u1, ids, threshold, count, maximum=maximum)
    else:
        terms = [privacy.secure_terms(by_id[i], i, r, len(u1), seed, maximum) for i in ids]
        sums, stats = masked_sums(r, u1, ids, terms, count, threshold)
    if levels:
        stats = merged(first, stats, len(u1), int(stats["secagg/survivors"]))
        if sums is not None:
            sums = dataclasses.replace(sums, maximum=maximum.maximum.to(next(iter(sums.sums.values())).device))
    return sums, stats


def central_mean(privacy, r: int, sampled: Sequence[int], ids: Sequence[int], messages: list, count: Callable,
                 masking: Callable | None, seed: int) -> tuple[list | None, float, dict[str, float]]:
    """Central DP: the noisy sum of the clients' clipped rows (each with its noise share) as the mean
    every upload the rule receives is; the noise multiplier that survived goes in the stats
    (``privacy/noise_multiplier_effective``), the noise std σ·Δ·sqrt(m/n) is returned."""
    secure, stats = masked_round(privacy, r, sampled, ids, messages, count, masking, seed)
    if secure is None:
        return None, 0.0, stats
    n, m = int(stats["secagg/clients"]), secure.count
    total = secure.sums["logits"]
    effective = privacy.noise_multiplier * math.sqrt(m / n)
    stats["privacy/noise_multiplier_effective"] = effective
    stats["privacy/noise_shares"] = float(m)
    mean = total / m
    if privacy.release.summed == "probabilities":  # post-processing: back onto the simplex, then logits
        p = mean.clamp_min(0)
        p = torch.where(p.sum(-1, keepdim=True) > 0, p, torch.ones_like(p))
        mean = (p / p.sum(-1, keepdim=True)).clamp_min(1e-12).log()
    by_id = dict(zip(ids, messages, strict=True))
    std = share_std(privacy.noise_multiplier, privacy.clip_norm, len(total), n) * math.sqrt(m)
    return [by_id[i].with_arrays({"logits": mean.float()}) for i in secure.clients], std, stats


