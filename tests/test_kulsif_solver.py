"""KuLSIF's solver: a float32 Cholesky factor refined in float64 gives float64's answer (the closed
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


def test_float32_factor_is_used_only_when_well_conditioned(monkeypatch):
    calls = []
    cholesky = torch.linalg.cholesky
    monkeypatch.setattr(torch.linalg, "cholesky", lambda a: calls.append(a.dtype) or cholesky(a))
    points = torch.randn(50, 4, dtype=torch.float64)
    k = gaussian_kernel(points, points, 1.0)
    rhs = torch.ones(50, 1, dtype=torch.float64)
    solve_regularised_kernel(k, 0.05, rhs)  # condition <= 21
    solve_regularised_kernel(k, 1.0 / kulsif.FLOAT32_MAX_CONDITION / 2, rhs)
    assert calls == [torch.float32, torch.float64]


def test_shared_squared_distances_give_the_same_estimator():
    g = torch.Generator().manual_seed(1)
    local, aux, x = torch.randn(60, 8, generator=g), torch.randn(150, 8, generator=g), torch.randn(40, 8, generator=g)
    alone = KuLSIF.fit(local, aux)
    shared = KuLSIF.fit(local, aux, aux_sq_dists=squared_distances(aux, aux, alone.dtype))
    assert torch.equal(alone.alpha, shared.alpha)
    assert torch.equal(alone(x), shared(x, aux_sq_dists=squared_distances(x, aux, alone.dtype)))
