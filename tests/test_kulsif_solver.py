"""KuLSIF's solver: float32 conjugate gradients or a float32 Cholesky factor, refined in float64, give float64's answer (the closed
form solved by a general float64 LU, as Kanamori et al. 2012 write it), float32 squared distances
stay within float32's rounding of it, and shared squared distances change nothing."""

import pytest
import torch

from fdlit.methods import kulsif
from fdlit.methods.kulsif import KuLSIF, gaussian_kernel, solve_regularised_kernel, squared_distances


def float64_reference(local, aux, x, lam=None):
    """r(x) of Kanamori et al. 2012, Theorem 1, with torch.linalg.solve in float64 throughout."""
    xl, a = local.double(), aux.double()
    n, m = len(a), len(xl)
    sigma = kulsif.median_bandwidth(xl)
    lam = float(min(n, m)) ** -0.9 if lam is None else lam
    lhs = gaussian_kernel(a, a, sigma) / n + lam * torch.eye(n, dtype=torch.float64)
    alpha = -torch.linalg.solve(lhs, gaussian_kernel(a, xl, sigma).sum(1, keepdim=True)) / (n * m * lam)
    return gaussian_kernel(x.double(), a, sigma) @ alpha[:, 0] + gaussian_kernel(x.double(), xl, sigma).mean(1) / lam


@pytest.mark.parametrize("lam", [None, 1e-3])  # the default (float32 factor) and an ill-conditioned one (float64)
def test_solver_matches_the_float64_closed_form(lam):
    g = torch.Generator().manual_seed(0)
    local = torch.randn(80, 16, generator=g)
    aux = torch.rand(300, 16, generator=g, dtype=torch.float64) * 6 - 3
    x = torch.randn(200, 16, generator=g)
    expected = float64_reference(local, aux, x, lam)
    got = KuLSIF.fit(local, aux, lam=lam, dtype=torch.float64)(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12 * float(expected.abs().max()))


@pytest.mark.parametrize("offset", [0.0, 100.0])  # far from the origin: norms >> spread (why they are centred)
def test_float32_squared_distances_stay_within_float32_rounding_of_float64(offset):
    g = torch.Generator().manual_seed(0)
    local = torch.randn(80, 16, generator=g) + offset
    aux = torch.rand(300, 16, generator=g, dtype=torch.float64) * 6 - 3 + offset
    x = torch.randn(200, 16, generator=g) + offset
    assert kulsif.kernel_dtype(None, len(aux)) == torch.float32  # the default regulariser takes this path
    expected = float64_reference(local, aux, x)
    fitted = KuLSIF.fit(local, aux)
    got = fitted(x)
    assert fitted.dtype == torch.float32 and got.dtype == torch.float64
    scale = float(expected.abs().max())
    err = float((got - expected).abs().max()) / scale
    assert 1e-13 < err < 1e-5  # float32's rounding is there, and small
    threshold = torch.quantile(expected, 0.25)  # what a selector does with r: no point near it flips
    clear = (expected - threshold).abs() > 1e-5 * scale
    assert torch.equal((got > threshold)[clear], (expected > threshold)[clear])


def test_float32_distances_only_where_the_system_is_well_conditioned():
    assert kulsif.kernel_dtype(None, 1000) == torch.float32  # 1 + 1000^0.9 ~ 502
    assert kulsif.kernel_dtype(0.05, 10) == torch.float32
    assert kulsif.kernel_dtype(1.0 / kulsif.FLOAT32_KERNEL_MAX_CONDITION / 2, 10) == torch.float64
    assert kulsif.kernel_dtype(None, 100_000) == torch.float64


def test_solver_paths_by_conditioning_and_convergence(monkeypatch):
    """Well conditioned: float32 conjugate gradients, no factorisation; when they run out of steps, the
    float32 Cholesky factor; ill conditioned: the float64 one. Each path gives float64's answer."""
    calls = []
    cholesky = torch.linalg.cholesky
    monkeypatch.setattr(torch.linalg, "cholesky", lambda a: calls.append(a.dtype) or cholesky(a))
    points = torch.randn(50, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    k = gaussian_kernel(points, points, 1.0)
    rhs = torch.ones(50, 1, dtype=torch.float64)

    def exact(lam):
        return torch.linalg.solve(k / 50 + lam * torch.eye(50, dtype=torch.float64), rhs)

    got = solve_regularised_kernel(k, 0.05, rhs)  # condition <= 21
    assert calls == []
    torch.testing.assert_close(got, exact(0.05), rtol=1e-11, atol=0)
    monkeypatch.setattr(kulsif, "CG_MAX_ITERATIONS", 2)
    got = solve_regularised_kernel(k, 0.05, rhs)
    assert calls == [torch.float32]
    torch.testing.assert_close(got, exact(0.05), rtol=1e-11, atol=0)
    lam = 1.0 / kulsif.FLOAT32_MAX_CONDITION / 2
    got = solve_regularised_kernel(k, lam, rhs)
    assert calls == [torch.float32, torch.float64]
    torch.testing.assert_close(got, exact(lam), rtol=1e-8, atol=0)


@pytest.mark.parametrize("lam", [0.5, 0.02, 2e-4])
def test_conjugate_gradients_reach_float64_accuracy_or_give_up(lam):
    """On a kernel over clustered points (a spread spectrum: the slow case for CG), refined float32 CG
    either returns float64's solution (residual below the tolerance) or None, never a rough answer."""
    g = torch.Generator().manual_seed(2)
    points = torch.cat([torch.randn(100, 3, generator=g, dtype=torch.float64) * 0.3 + c for c in (-2.0, 0.0, 2.0)])
    k = gaussian_kernel(points, points, 0.8)
    rhs = torch.rand(300, 1, generator=g, dtype=torch.float64)
    lhs = k / 300 + lam * torch.eye(300, dtype=torch.float64)
    got = kulsif.refined_conjugate_gradients(k, k.float(), lam, rhs)
    if got is None:
        assert lam < 0.02  # the well-conditioned systems converge
        return
    assert float((rhs - lhs @ got).norm()) <= kulsif.RESIDUAL_TOLERANCE * float(rhs.norm())
    torch.testing.assert_close(got, torch.linalg.solve(lhs, rhs), rtol=1e-9, atol=0)


def test_shared_squared_distances_give_the_same_estimator():
    g = torch.Generator().manual_seed(1)
    local, aux, x = torch.randn(60, 8, generator=g), torch.randn(150, 8, generator=g), torch.randn(40, 8, generator=g)
    alone = KuLSIF.fit(local, aux)
    shared = KuLSIF.fit(local, aux, aux_sq_dists=squared_distances(aux, aux, alone.dtype))
    assert torch.equal(alone.alpha, shared.alpha)
    assert torch.equal(alone(x), shared(x, aux_sq_dists=squared_distances(x, aux, alone.dtype)))


@pytest.mark.parametrize("scale", [1e-30, 1e-300, 0.0])
def test_tiny_right_hand_sides_do_not_underflow_the_float32_passes(scale):
    """Local points far from every auxiliary point make K(A, X) 1_m tiny (below float32's range)."""
    points = torch.randn(40, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    k = gaussian_kernel(points, points, 1.0)
    rhs = torch.rand(40, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * scale
    got = solve_regularised_kernel(k, 0.05, rhs)
    expected = torch.linalg.solve(k / 40 + 0.05 * torch.eye(40, dtype=torch.float64), rhs)
    torch.testing.assert_close(got, expected, rtol=1e-11, atol=0)
