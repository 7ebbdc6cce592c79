"""Per-class diagonal Gaussians on logits: UWA's density model (Kovalchuk et al. 2026, Sec. 4.4, App. A.4).

Computed in torch on the logits' device, in float64 and log space (the Mahalanobis term as matrix
products, or elementwise: :func:`mixture_log_likelihood`); no scikit-learn on the hot path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fdlit.errors import ConfigError


@dataclass
class DiagonalGaussianMixture:
    """Equal-weight mixture of diagonal Gaussians, one component per local class.

    means, variances: K x C; classes: K class ids. ``dropped``: local classes that got no component.
    The weights are 1/K over the K fitted components: 1/|C_i| when none was dropped, and with dropped
    components the mixture is renormalised over the ones that exist, so l_i stays a log-density.
    """

    means: torch.Tensor
    variances: torch.Tensor
    classes: torch.Tensor
    dropped: int = 0
    floored: int = 0  # variance entries raised to the floor (zero or tiny variance)
    degenerate: int = 0  # zero-spread components given the pooled variance (``robust``)
    shrunk: int = 0  # components with few samples shrunk toward the pooled variance (``robust``)
    collapsed: bool = False  # no component spreads: no components at all (``robust``)

    @classmethod
    def fit(
        cls,
        logits: torch.Tensor,
        labels: torch.Tensor,
        classes: list[int],
        variance_floor: float = 1e-4,
        min_samples: int = 2,
        *,
        robust: bool = False,
        shrinkage_samples: int = 10,
    ) -> DiagonalGaussianMixture:
        """Fit one component per class in ``classes`` on the logits of that class's samples.

        Maximum-likelihood mean and variance (as sklearn's GaussianMixture M-step with known
        responsibilities), variance floored at ``variance_floor`` so a class whose logits barely move
        cannot produce an infinite density. **choice** (docs/algorithms.md): a class with fewer than
        ``min_samples`` (2) calibration samples gets no component, since its variance is undefined;
        it is counted in ``dropped``; variance entries raised to the floor (a logit that does not
        move within a class) are counted in ``floored``. A client left with no component has log-likelihood -inf
        everywhere, i.e. zero weight (see :func:`mixture_log_likelihood`).

        ``robust`` (**choice**, docs/algorithms.md "UWA: degenerate density fits") repairs the fits whose
        variance says nothing about the data, before the floor:

        * a *zero-spread* component (its class's logits do not move: every variance below the floor)
          takes the client's pooled within-class variance, sum_k n_k var_k / sum_k n_k over its
          components that do spread (the "tied" estimate); counted in ``degenerate``;
        * a component fitted on fewer than ``shrinkage_samples`` samples is shrunk toward that pooled
          variance with ``shrinkage_samples`` pseudo-samples, (n var + nu var_pool) / (n + nu);
          counted in ``shrunk``;
        * a *collapsed* client (no component spreads: its logits do not depend on its input, e.g.
          identical rows) gets no component at all (``collapsed``; every class counted in
          ``dropped``), so its weight is 0. Its floored density would otherwise be the floor's, not
          the data's, and peak exactly where all its logits land: on every public sample.

        A fit with every component spread and fitted on at least ``shrinkage_samples`` samples is
        the same with or without ``robust``.
        """
        z = logits.double()
        fits = []  # (class, n, mean, ML variance) of every class with enough samples
        for c in classes:
            zc = z[labels == c]
            if len(zc) < min_samples:
                continue
            fits.append((c, len(zc), zc.mean(0), zc.var(0, unbiased=False)))
        degenerate = shrunk = 0
        collapsed = False
        if robust and fits:
            spread = [(n, var) for _, n, _, var in fits if not bool((var < variance_floor).all())]
            if not spread:
                collapsed, fits = True, []
            else:
                pooled = sum(n * var for n, var in spread) / sum(n for n, _ in spread)
                repaired = []
                for c, n, mu, var in fits:
                    if bool((var < variance_floor).all()):
                        var, degenerate = pooled, degenerate + 1
                    elif n < shrinkage_samples:
                        var, shrunk = (n * var + shrinkage_samples * pooled) / (n + shrinkage_samples), shrunk + 1
                    repaired.append((c, n, mu, var))
                fits = repaired
        floored = sum(int((var < variance_floor).sum()) for _, _, _, var in fits)
        c_dim = logits.shape[-1]
        if fits:
            mu = torch.stack([f[2] for f in fits])
            var = torch.stack([f[3] for f in fits]).clamp_min(variance_floor)
        else:
            mu = var = torch.empty(0, c_dim, dtype=torch.float64, device=logits.device)
        return cls(mu, var, torch.tensor([f[0] for f in fits], dtype=torch.long),
                   dropped=len(classes) - len(fits), floored=floored, degenerate=degenerate, shrunk=shrunk,
                   collapsed=collapsed)

    def log_likelihood(self, z: torch.Tensor, method: str = "matmul") -> torch.Tensor:
        """log( (1/K) sum_k N(z; mu_k, diag var_k) ) for each row of z (N x C) -> N."""
        return mixture_log_likelihood(
            z[None], self.means[None], self.variances[None], torch.ones(1, len(self.means), dtype=torch.bool),
            method,
        )[0]


DENSITY_METHODS = ("matmul", "direct")
CHUNK_ELEMENTS = 1 << 24  # float64 elements of one chunk's largest temporary (~128 MiB)


def mixture_log_likelihood(
    z: torch.Tensor, means: torch.Tensor, variances: torch.Tensor, valid: torch.Tensor, method: str = "matmul"
) -> torch.Tensor:
    """Batched over clients: z (M x N x C), means/variances (M x K x C, padded), valid (M x K) -> M x N.

    ``method`` says how the squared Mahalanobis term q_k(z) = sum_d (z_d - mu_kd)^2 / v_kd is computed:

    * ``matmul`` (default): expanded into two batched matrix products in float64,
      q = (z - c)^2 @ (1/v)^T - 2 (z - c) @ ((mu - c)/v)^T + sum_d (mu_d - c_d)^2 / v_d,
      where c is the client's mean of its component means. Centering keeps the expanded terms at
      the size of the logits' spread around c instead of the logits' size; what cancels is float64
      rounding of those terms. Tolerance against ``direct``: |l_matmul - l_direct| <= 1e-15 T(z),
      T = max_k sum_d ((z_d - c_d)^2 + (mu_kd - c_d)^2) / v_kd (measured up to 5e-16 T). In
      relative terms, |l_matmul - l_direct| / (1 + |l_direct|) is ~1e-14 on CIFAR-100-shaped
      synthetic logits and stays below 1e-7 even with components 5e4 standard deviations apart
      (tests/test_aggregators.py). About 20x faster on a CPU at the CIFAR-100 shape
      (``benchmarks/density.py``; docs/algorithms.md, "In fdlit").
    * ``direct``: the elementwise sum of (z - mu)^2 / v in float64, the reference form; O(M N K C)
      elementwise work and memory traffic.

    Both run on z's device, in chunks of public samples so memory stays bounded. Rows of a client
    with no valid component are -inf.
    """
    if method not in DENSITY_METHODS:
        raise ConfigError("aggregator.density_method", f"allowed: {', '.join(DENSITY_METHODS)}; got {method!r}")
    z = z.double()
    m, n, c = z.shape
    if means.shape[1] == 0:
        return torch.full((m, n), -math.inf, dtype=torch.float64, device=z.device)
    valid = valid.to(z.device)
    one = torch.ones((), dtype=torch.float64, device=z.device)
    # padded components get mean 0 and variance 1 so the algebra stays finite; they are masked below
    var = torch.where(valid[..., None], variances.to(z.device, torch.float64), one)
    mu = torch.where(valid[..., None], means.to(z.device, torch.float64), 0 * one)
    log_norm = -0.5 * (torch.log(var).sum(-1) + c * math.log(2 * math.pi))  # M x K
    comp = (_components_matmul if method == "matmul" else _components_direct)(z, mu, var, valid, log_norm)
    if not bool(valid.all()):
        comp = comp.masked_fill(~valid[:, None, :], -math.inf)
    k = valid.sum(1).clamp_min(1).to(torch.float64)  # equal weights 1/K over the K fitted components
    return torch.logsumexp(comp, dim=-1) - torch.log(k)[:, None]


def _components_direct(z, mu, var, valid, log_norm):
    """log N(z; mu_k, diag v_k) for every component: M x N x K, elementwise."""
    m, n, c = z.shape
    inv = (1.0 / var)[:, None]  # M x 1 x K x C
    mu = mu[:, None]
    chunk = max(1, CHUNK_ELEMENTS // max(1, m * mu.shape[2] * c))
    quad = torch.cat([((z[:, i : i + chunk, None, :] - mu).square() * inv).sum(-1)  # M x chunk x K
                      for i in range(0, n, chunk)], dim=1)
    return -0.5 * quad + log_norm[:, None, :]


def _components_matmul(z, mu, var, valid, log_norm):
    """The same as two batched matrix products on centred logits; -1/2 and the normalisation
    are folded into the operands so nothing else touches the M x N x K result."""
    m, n, c = z.shape
    w = valid[..., None].to(torch.float64)
    center = (mu * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1)  # M x 1 x C
    inv = 1.0 / var  # M x K x C
    mu_c = mu - center
    half_inv_t = inv.transpose(1, 2).mul(-0.5)  # -1/2 (z - c)^2 / v
    lin_t = (mu_c * inv).transpose(1, 2)  # -1/2 x -2 (z - c) (mu - c) / v
    bias = (log_norm - 0.5 * (mu_c.square() * inv).sum(-1))[:, None, :]  # M x 1 x K
    chunk = max(1, CHUNK_ELEMENTS // max(1, m * max(c, mu.shape[1])))
    out = []
    for i in range(0, n, chunk):
        zc = z[:, i : i + chunk] - center
        out.append(torch.baddbmm(torch.baddbmm(bias, zc, lin_t), zc.square(), half_inv_t))
    return torch.cat(out, dim=1) if len(out) > 1 else out[0]
