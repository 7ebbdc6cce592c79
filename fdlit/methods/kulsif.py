"""KuLSIF density-ratio estimation (Kanamori, Suzuki, Sugiyama 2012), Selective-FD's client selector."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Above this bound on the condition number of K/n + lambda I, the system is factored in float64;
# below it a float32 Cholesky factor with float64 refinement reaches float64's accuracy
FLOAT32_MAX_CONDITION = 1e4
# Up to this bound the kernels (squared distances, exponential) are computed in float32 (``kernel_dtype``):
# their rounding moves the weights by at most ~bound * 1e-7 relative
FLOAT32_KERNEL_MAX_CONDITION = 1e3
REFINEMENT_STEPS = 2
# Conjugate gradients: each float32 pass reduces the float64 residual by this factor at least (float32
# rounding of a 1,000-term product is ~1e-6), passes stop at RESIDUAL_TOLERANCE relative to the right-hand
# side, and after CG_MAX_ITERATIONS inner steps in all (~ the matrix-vector products one Cholesky costs here)
# the factorisation takes over
CG_PASS_TOLERANCE = 1e-5
RESIDUAL_TOLERANCE = 1e-13
CG_MAX_ITERATIONS = 60


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
    return float32_kernel(d2, sigma).double()


def float32_kernel(sq_dists: torch.Tensor, sigma: float) -> torch.Tensor:
    """The Gaussian kernel of float32 squared distances, in float32 (``gaussian_kernel`` returns it
    in float64; the solver's float32 passes use it as it is)."""
    return torch.exp(sq_dists * (-0.5 / sigma**2))


def solve_regularised_kernel(k_aa: torch.Tensor, lam: float, rhs: torch.Tensor,
                             k_aa32: torch.Tensor | None = None) -> torch.Tensor:
    """x with (K/n + lambda I) x = rhs for a Gaussian kernel matrix K (n x n), in float64.

    The matrix is symmetric positive definite with eigenvalues in [lambda, 1 + lambda] (a kernel
    bounded by 1 has row sums, hence eigenvalues, at most n), so its condition number is at most
    (1 + lambda) / lambda. Below ``FLOAT32_MAX_CONDITION`` the system is solved by conjugate
    gradients in float32 inside float64 iterative refinement (:func:`refined_conjugate_gradients`):
    a kernel over spread-out points is close to the identity, so a handful of matrix-vector products
    replace an n^3/3 factorisation; where they do not converge fast, by a float32 Cholesky factor
    refined in float64 (Wilkinson's iterative refinement: each step gains about -log10(cond * 2^-24)
    digits, two reach float64's accuracy here). Above the bound, a float64 Cholesky.
    ``k_aa32``: K in float32, when the kernel was computed in float32 (saves the copy)."""
    well_conditioned = (1.0 + lam) / lam <= FLOAT32_MAX_CONDITION
    if well_conditioned and rhs.shape[-1] == 1:
        x = refined_conjugate_gradients(k_aa, k_aa.float() if k_aa32 is None else k_aa32, lam, rhs)
        if x is not None:
            return x
    lhs = k_aa / len(k_aa)
    lhs.diagonal().add_(lam)
    if not well_conditioned:
        return torch.cholesky_solve(rhs, torch.linalg.cholesky(lhs))
    factor = torch.linalg.cholesky(lhs.float())
    x = torch.cholesky_solve(rhs.float(), factor).double()
    for _ in range(REFINEMENT_STEPS):
        x += torch.cholesky_solve((rhs - lhs @ x).float(), factor).double()
    return x


def refined_conjugate_gradients(k_aa: torch.Tensor, k32: torch.Tensor, lam: float,
                                rhs: torch.Tensor) -> torch.Tensor | None:
    """(K/n + lambda I) x = rhs (one column) by float64 iterative refinement whose corrections are
    float32 conjugate-gradient solves (Hestenes and Stiefel 1952) of the residual, each to
    ``CG_PASS_TOLERANCE``; the float64 residual ends below ``RESIDUAL_TOLERANCE`` of rhs, so x is
    float64's solution to within the condition number times that. None when ``CG_MAX_ITERATIONS``
    inner steps do not get there."""
    n = len(k_aa)
    b = rhs[:, 0]
    largest = float(b.abs().max())
    if largest == 0:
        return torch.zeros_like(rhs)
    # solved for rhs scaled by a power of two (exact) to O(1): norms of tiny vectors underflow
    scale = math.ldexp(1.0, math.frexp(largest)[1])
    b = b / scale
    x = torch.zeros_like(b)
    target = RESIDUAL_TOLERANCE * float(b.norm())
    budget = CG_MAX_ITERATIONS
    while True:
        residual = torch.addmv(b.sub(x, alpha=lam), k_aa, x, alpha=-1.0 / n)
        size = float(residual.norm())
        if size <= target:
            return (x * scale)[:, None]
        if budget == 0:
            return None
        # float32 CG on K/n + lambda I for the correction, of the residual scaled to norm 1 (the pass's
        # tolerance is then relative, and float32's range is never approached); one fused kernel per
        # vector update, as the matrix-vector products are memory-bound and the rest is call overhead
        r = (residual / size).float()
        z, p = torch.zeros_like(r), r.clone()
        rr = 1.0
        while budget > 0 and rr > CG_PASS_TOLERANCE**2:
            q = torch.addmv(p, k32, p, beta=lam, alpha=1.0 / n)
            curvature = float(torch.dot(p, q))
            if not curvature > 0:  # float32 breakdown: refine from here (or give up when the budget is spent)
                budget -= 1
                break
            step = rr / curvature
            z.add_(p, alpha=step)
            r.sub_(q, alpha=step)
            rr, rr_old = float(torch.dot(r, r)), rr
            torch.add(r, p, alpha=rr / rr_old, out=p)
            budget -= 1
        x.add_(z.double(), alpha=size)


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
        d_aa = squared_distances(a, a, dtype) if aux_sq_dists is None else aux_sq_dists
        k_aa32 = float32_kernel(d_aa, sigma) if d_aa.dtype == torch.float32 else None
        k_aa = k_aa32.double() if k_aa32 is not None else gaussian_kernel(a, a, sigma, d_aa)
        k_ax = gaussian_kernel(a, x, sigma, dtype=dtype)
        alpha = -solve_regularised_kernel(k_aa, lam, k_ax.sum(1, keepdim=True), k_aa32) / (n * m * lam)
        return cls(a, x, alpha[:, 0], sigma, lam, dtype)

    def __call__(self, x: torch.Tensor, aux_sq_dists: torch.Tensor | None = None) -> torch.Tensor:
        """r(x); ``aux_sq_dists``: ``squared_distances(x, aux)``, when already known."""
        x = x.flatten(1).double()
        return gaussian_kernel(x, self.aux, self.sigma, aux_sq_dists, self.dtype) @ self.alpha + gaussian_kernel(
            x, self.local, self.sigma, dtype=self.dtype).mean(1) / self.lam
