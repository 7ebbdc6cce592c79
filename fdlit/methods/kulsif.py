"""KuLSIF density-ratio estimation (Kanamori, Suzuki, Sugiyama 2012), Selective-FD's client selector."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Above this bound on the condition number of K/n + lambda I, the system is factored in float64;
# below it a float32 Cholesky factor with float64 refinement reaches float64's accuracy
FLOAT32_MAX_CONDITION = 1e4
# Up to this bound the kernels (squared distances, exponential) are computed in float32 (``kernel_dtype``):
# their rounding moves the weights by at most ~bound * 1e-7 relative
FLOAT32_KERNEL_MAX_CONDITION = 1e3
REFINEMENT_STEPS = 2


def kernel_dtype(lam: float | None, n: int) -> torch.dtype:
    """The precision in which the squared distances of an estimator with regulariser ``lam`` (None:
    the default rate, at least min(n, m)^-0.9 >= n^-0.9) and n auxiliary points are computed:
    float32 while the system's condition number stays at most ``FLOAT32_KERNEL_MAX_CONDITION``, else
    float64, and the kernel's exponential with them; the solve and the estimates stay float64.

    A float32 squared distance is off by ~1e-7 of the points' squared spread (they are taken about
    the points' mean), so a kernel entry by ~1e-7 relative; the solve moves the weights by at most
    the condition number times that."""
    bound = (1.0 + lam) / lam if lam is not None else 1.0 + float(n) ** 0.9
    return torch.float32 if bound <= FLOAT32_KERNEL_MAX_CONDITION else torch.float64


def squared_distances(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """D[i, j] = ||a_i - b_j||^2 in ``dtype``: what every kernel of one bandwidth is computed from, so that estimators sharing points (one client's per-class
    selectors share the auxiliary set) compute it once. In float32 the points are first centred on
    b's mean (in float64): distances do not change, and float32's rounding of
    ||a||^2 + ||b||^2 - 2 a.b is relative to the points' spread, not their norms."""
    a, b = a.double(), b.double()
    if dtype != torch.float64:
        centre = b.mean(0)
        a, b = (a - centre).to(dtype), (b - centre).to(dtype)
    return torch.cdist(a, b).pow_(2)


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor, sigma: float,
                    sq_dists: torch.Tensor | None = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """K[i, j] = exp( -||a_i - b_j||^2 / (2 sigma^2) ), computed in the precision of the squared
    distances (``sq_dists``, when already known; else computed in ``dtype``) and returned in float64."""
    d2 = squared_distances(a, b, dtype) if sq_dists is None else sq_dists
    if d2.dtype == torch.float64:
        return torch.exp(-d2 / (2.0 * sigma**2))
    return torch.exp(d2 * (-0.5 / sigma**2)).double()


def solve_regularised_kernel(k_aa: torch.Tensor, lam: float, rhs: torch.Tensor) -> torch.Tensor:
    """x with (K/n + lambda I) x = rhs for a Gaussian kernel matrix K (n x n), in float64.

    The matrix is symmetric positive definite with eigenvalues in [lambda, 1 + lambda] (a kernel
    bounded by 1 has row sums, hence eigenvalues, at most n), so its condition number is at most
    (1 + lambda) / lambda. Below ``FLOAT32_MAX_CONDITION`` it is factored by a float32 Cholesky
    (half a float64 factorisation's time) and the solution refined in float64 (Wilkinson's
    iterative refinement: each step gains about -log10(cond * 2^-24) digits, two reach float64's
    accuracy here); above, a float64 Cholesky."""
    n = len(k_aa)
    lhs = k_aa / n
    lhs.diagonal().add_(lam)
    if (1.0 + lam) / lam > FLOAT32_MAX_CONDITION:
        return torch.cholesky_solve(rhs, torch.linalg.cholesky(lhs))
    factor = torch.linalg.cholesky(lhs.float())
    x = torch.cholesky_solve(rhs.float(), factor).double()
    for _ in range(REFINEMENT_STEPS):
        x += torch.cholesky_solve((rhs - lhs @ x).float(), factor).double()
    return x


def median_bandwidth(x: torch.Tensor, max_points: int = 1000) -> float:
    """Median heuristic: sigma = median pairwise distance among (up to ``max_points``) samples of x."""
    x = x[:max_points].double()
    d = torch.cdist(x, x)
    off = d[~torch.eye(len(x), dtype=torch.bool, device=x.device)]
    med = float(off.median()) if off.numel() else 1.0
    return med if med > 0 else 1.0


@dataclass
class KuLSIF:
    """Estimate r(x) = p(x) / u(x) from samples X ~ p (numerator, m) and A ~ u (auxiliary, n).

    Closed form (Kanamori et al. 2012, Theorem 1; Selective-FD (Shao et al. 2024), Methods;
    docs/algorithms.md, Selective-FD):

        alpha = -(K(A,A)/n + lambda I)^{-1} K(A,X) 1_m / (n m lambda)
        r(x)  = K(x,A) alpha + (1/(m lambda)) sum_j K(x, X_j)

    with a Gaussian kernel of width sigma. One n x n symmetric positive definite solve
    (:func:`solve_regularised_kernel`); kernels computed in float32 where the system's conditioning
    allows (:func:`kernel_dtype`), the solve, weights and results in float64, on the device of the inputs.
    """

    aux: torch.Tensor
    local: torch.Tensor
    alpha: torch.Tensor
    sigma: float
    lam: float
    dtype: torch.dtype = torch.float64  # in which the kernels are computed (``kernel_dtype``)

    @classmethod
    def fit(cls, local: torch.Tensor, aux: torch.Tensor, sigma: float | None = None,
            lam: float | None = None, aux_sq_dists: torch.Tensor | None = None,
            dtype: torch.dtype | None = None) -> KuLSIF:
        """local: m x d samples of p; aux: n x d samples of u. sigma None: median heuristic on
        ``local``; lam None: min(n, m)^-0.9, a rate allowed by Selective-FD's Theorem 1 (lambda^-1 =
        O(min(n,m)^(1-delta))). ``aux_sq_dists``: ``squared_distances(aux, aux)``, when several
        estimators share ``aux`` (in ``dtype``). ``dtype``: in which kernels are computed; None: ``kernel_dtype``."""
        x, a = local.flatten(1).double(), aux.flatten(1).double()
        n, m = len(a), len(x)
        sigma = float(sigma) if sigma is not None else median_bandwidth(x)
        lam = float(lam) if lam is not None else float(min(n, m)) ** -0.9
        dtype = dtype or kernel_dtype(lam, n)
        k_aa = gaussian_kernel(a, a, sigma, aux_sq_dists, dtype)
        k_ax = gaussian_kernel(a, x, sigma, dtype=dtype)
        alpha = -solve_regularised_kernel(k_aa, lam, k_ax.sum(1, keepdim=True)) / (n * m * lam)
        return cls(a, x, alpha[:, 0], sigma, lam, dtype)

    def __call__(self, x: torch.Tensor, aux_sq_dists: torch.Tensor | None = None) -> torch.Tensor:
        """r(x); ``aux_sq_dists``: ``squared_distances(x, aux)``, when already known."""
        x = x.flatten(1).double()
        return gaussian_kernel(x, self.aux, self.sigma, aux_sq_dists, self.dtype) @ self.alpha + gaussian_kernel(
            x, self.local, self.sigma, dtype=self.dtype).mean(1) / self.lam
