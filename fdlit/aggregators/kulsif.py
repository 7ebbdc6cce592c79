"""KuLSIF density-ratio estimation (Kanamori, Suzuki, Sugiyama 2012), Selective-FD's client selector."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor, sigma: float) -> torch.Tensor:
    """K[i, j] = exp( -||a_i - b_j||^2 / (2 sigma^2) ), float64."""
    d2 = torch.cdist(a.double(), b.double()).pow(2)
    return torch.exp(-d2 / (2.0 * sigma**2))


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

    with a Gaussian kernel of width sigma. One n x n linear solve; everything in float64 on the
    device of the inputs.
    """

    aux: torch.Tensor
    local: torch.Tensor
    alpha: torch.Tensor
    sigma: float
    lam: float

    @classmethod
    def fit(cls, local: torch.Tensor, aux: torch.Tensor, sigma: float | None = None,
            lam: float | None = None) -> "KuLSIF":
        """local: m x d samples of p; aux: n x d samples of u. sigma None: median heuristic on
        ``local``; lam None: min(n, m)^-0.9, a rate allowed by Selective-FD's Theorem 1 (lambda^-1 =
        O(min(n,m)^(1-delta)))."""
        x, a = local.flatten(1).double(), aux.flatten(1).double()
        n, m = len(a), len(x)
        sigma = float(sigma) if sigma is not None else median_bandwidth(x)
        lam = float(lam) if lam is not None else float(min(n, m)) ** -0.9
        k_aa = gaussian_kernel(a, a, sigma)
        k_ax = gaussian_kernel(a, x, sigma)
        lhs = k_aa / n + lam * torch.eye(n, dtype=torch.float64, device=a.device)
        alpha = -torch.linalg.solve(lhs, k_ax.sum(1, keepdim=True)) / (n * m * lam)
        return cls(a, x, alpha[:, 0], sigma, lam)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1).double()
        return gaussian_kernel(x, self.aux, self.sigma) @ self.alpha + gaussian_kernel(
            x, self.local, self.sigma).mean(1) / self.lam
