"""Per-class diagonal Gaussians on logits: UWA's density model (Kovalchuk et al. 2026, Sec. 4.4, App. A.4).

Computed in torch on the logits' device, in float64 and log space; no scikit-learn on the hot path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class DiagonalGaussianMixture:
    """Equal-weight mixture of diagonal Gaussians, one component per local class.

    means, variances: K x C; classes: K class ids. ``dropped``: local classes that got no component.
    """

    means: torch.Tensor
    variances: torch.Tensor
    classes: torch.Tensor
    dropped: int = 0
    floored: int = 0  # variance entries raised to the floor (zero or tiny variance)

    @classmethod
    def fit(
        cls,
        logits: torch.Tensor,
        labels: torch.Tensor,
        classes: list[int],
        variance_floor: float = 1e-4,
        min_samples: int = 2,
    ) -> "DiagonalGaussianMixture":
        """Fit one component per class in ``classes`` on the logits of that class's samples.

        Maximum-likelihood mean and variance (as sklearn's GaussianMixture M-step with known
        responsibilities), variance floored at ``variance_floor`` so a class whose logits barely move
        cannot produce an infinite density. **choice** (docs/algorithms.md): a class with fewer than
        ``min_samples`` (2) calibration samples gets no component, since its variance is undefined;
        it is counted in ``dropped``; variance entries raised to the floor (a logit that does not
        move within a class) are counted in ``floored``. A client left with no component has log-likelihood -inf
        everywhere, i.e. zero weight (see :func:`mixture_log_likelihood`).
        """
        z = logits.double()
        means, variances, kept = [], [], []
        floored = 0
        for c in classes:
            zc = z[labels == c]
            if len(zc) < min_samples:
                continue
            means.append(zc.mean(0))
            var = zc.var(0, unbiased=False)
            floored += int((var < variance_floor).sum())
            variances.append(var.clamp_min(variance_floor))
            kept.append(c)
        c_dim = logits.shape[-1]
        if kept:
            mu, var = torch.stack(means), torch.stack(variances)
        else:
            mu = var = torch.empty(0, c_dim, dtype=torch.float64, device=logits.device)
        return cls(mu, var, torch.tensor(kept, dtype=torch.long), dropped=len(classes) - len(kept),
                   floored=floored)

    def log_likelihood(self, z: torch.Tensor) -> torch.Tensor:
        """log( (1/K) sum_k N(z; mu_k, diag var_k) ) for each row of z (N x C) -> N."""
        return mixture_log_likelihood(
            z[None], self.means[None], self.variances[None], torch.ones(1, len(self.means), dtype=torch.bool)
        )[0]


def mixture_log_likelihood(
    z: torch.Tensor, means: torch.Tensor, variances: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Batched over clients: z (M x N x C), means/variances (M x K x C, padded), valid (M x K) -> M x N.

    The squared Mahalanobis term sum_d (z_d - mu_d)^2 / v_d is computed directly, elementwise and
    summed, in chunks of public samples so memory stays bounded (CIFAR-100: K = 90 components of
    dimension C = 100). Not the expanded z^2/v - 2 z mu/v + mu^2/v matrix-product form, which
    cancels catastrophically when logits are large relative to their spread.
    Rows of a client with no valid component are -inf.
    """
    z = z.double()
    m, n, c = z.shape
    if means.shape[1] == 0:
        return torch.full((m, n), -math.inf, dtype=torch.float64, device=z.device)
    valid = valid.to(z.device)
    # padded components get variance 1 so the algebra stays finite; they are masked below
    var = torch.where(valid[..., None], variances.to(z.device, torch.float64), torch.ones((), dtype=torch.float64, device=z.device))
    mu = torch.where(valid[..., None], means.to(z.device, torch.float64), torch.zeros((), dtype=torch.float64, device=z.device))
    inv = (1.0 / var)[:, None]  # M x 1 x K x C
    mu = mu[:, None]
    n_comp = mu.shape[2]
    chunk = max(1, (1 << 24) // max(1, m * n_comp * c))  # ~128 MiB of float64 per chunk
    quad = torch.cat([
        ((z[:, i : i + chunk, None, :] - mu).square() * inv).sum(-1)  # M x chunk x K
        for i in range(0, n, chunk)
    ], dim=1)
    log_norm = -0.5 * (torch.log(var).sum(-1) + c * math.log(2 * math.pi))  # M x K
    comp = -0.5 * quad + log_norm[:, None, :]
    comp = comp.masked_fill(~valid[:, None, :], -math.inf)
    k = valid.sum(1).clamp_min(1).to(torch.float64)  # equal mixture weights 1/|C_i|
    return torch.logsumexp(comp, dim=-1) - torch.log(k)[:, None]
