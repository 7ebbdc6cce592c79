"""KuLSIF density-ratio estimation (Kanamori, Suzuki, Sugiyama 2012), Selective-FD's client selector."""

from __future__ import annotations

from dataclasses import dataclass

import torch


# Above this bound on the condition number of K/n + lambda I, the system is factored in float64;
# below it a float32 Cholesky factor with float64 refinement reaches float64's accuracy
FLOAT32_MAX_CONDITION = 1e4
REFINEMENT_STEPS = 2


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """D[i, j] = ||a_i - b_j||^2 in float64: what every kernel of one bandwidth is computed from,
    so that estimators sharing points (one client's per-class selectors share the auxiliary set)
    compute it once."""
    return torch.cdist(a.double(), b.double()).pow(2)


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor, sigma: float,
                    sq_dists: torch.Tensor | None = None) -> torch.Tensor:
    """K[i, j] = exp( -||a_i - b_j||^2 / (2 sigma^2) ), float64 (``sq_dists``: the squared
    distances of a and b, when already known)."""
    d2 = squared_distances(a, b) if sq_dists is None else sq_dists
    return torch.exp(-d2 / (2.0 * sigma**2))


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
    (:func:`solve_regularised_kernel`); results in float64 on the device of the inputs.
    """

    aux: torch.Tensor
    local: torch.Tensor
    alpha: torch.Tensor
    sigma: float
    lam: float

    @classmethod
    def fit(cls, local: torch.Tensor, aux: torch.Tensor, sigma: float | None = None,
            lam: float | None = None, aux_sq_dists: torch.Tensor | None = None) -> "KuLSIF":
        """local: m x d samples of p; aux: n x d samples of u. sigma None: median heuristic on
        ``local``; lam None: min(n, m)^-0.9, a rate allowed by Selective-FD's Theorem 1 (lambda^-1 =
        O(min(n,m)^(1-delta))). ``aux_sq_dists``: ``squared_distances(aux, aux)``, when several
        estimators share ``aux``."""
        x, a = local.flatten(1).double(), aux.flatten(1).double()
        n, m = len(a), len(x)
        sigma = float(sigma) if sigma is not None else median_bandwidth(x)
        lam = float(lam) if lam is not None else float(min(n, m)) ** -0.9
        k_aa = gaussian_kernel(a, a, sigma, aux_sq_dists)
        k_ax = gaussian_kernel(a, x, sigma)
        alpha = -solve_regularised_kernel(k_aa, lam, k_ax.sum(1, keepdim=True)) / (n * m * lam)
        return cls(a, x, alpha[:, 0], sigma, lam)

    def __call__(self, x: torch.Tensor, aux_sq_dists: torch.Tensor | None = None) -> torch.Tensor:
        """r(x); ``aux_sq_dists``: ``squared_distances(x, aux)``, when already known."""
        x = x.flatten(1).double()
        return gaussian_kernel(x, self.aux, self.sigma, aux_sq_dists) @ self.alpha + gaussian_kernel(
            x, self.local, self.sigma).mean(1) / self.lam
