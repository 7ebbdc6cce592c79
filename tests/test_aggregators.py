import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.mixture import GaussianMixture

from fdlit.errors import ConfigError
from fdlit.messages import Message
from fdlit.methods import (
    DiagonalGaussianMixture,
    ProbabilityAveraging,
    SmoothedUncertaintyWeighted,
    UncertaintyWeighted,
    mixture_log_likelihood,
    weight_concentration,
)
from fdlit.methods.base import context_for

M, N, C = 5, 64, 10


def gmm_uploads(seed=0, k=3):
    """Clients with logits and density models fitted on their own (synthetic) calibration logits."""
    g = torch.Generator().manual_seed(seed)
    uploads = []
    for i in range(M):
        classes = sorted(torch.randperm(C, generator=g)[:k].tolist())
        cal_y = torch.tensor(classes).repeat(20)
        cal_z = torch.randn(len(cal_y), C, generator=g) + 4 * torch.nn.functional.one_hot(cal_y, C)
        gmm = DiagonalGaussianMixture.fit(cal_z, cal_y, classes)
        uploads.append(Message({
            "logits": torch.randn(N, C, generator=g) * 2,
            "gmm_means": gmm.means.float(), "gmm_stds": gmm.variances.sqrt().float(), "gmm_classes": gmm.classes,
        }, metrics={"density/dropped_components": 0.0}))
    return uploads


@pytest.mark.parametrize("agg", [ProbabilityAveraging(), UncertaintyWeighted(),
                                 SmoothedUncertaintyWeighted(tau=0.25)])
def test_weights_are_a_distribution_and_teacher_is_probability(agg):
    ups = gmm_uploads()
    r = agg.aggregate(ups, context_for(ups))
    assert (r.weights >= 0).all()
    torch.testing.assert_close(r.weights.sum(0), torch.ones(N))
    torch.testing.assert_close(r.teacher.sum(-1), torch.ones(N))
    z = torch.stack([u["logits"] for u in gmm_uploads()])
    torch.testing.assert_close(r.teacher, torch.einsum("mn,mnc->nc", r.weights, z.softmax(-1)))


def test_avg_is_mean_of_probabilities_and_chi_is_one_over_m():
    ups = gmm_uploads()
    r = ProbabilityAveraging().aggregate(ups, context_for(ups))
    z = torch.stack([u["logits"] for u in ups])
    torch.testing.assert_close(r.teacher, z.softmax(-1).mean(0))
    assert float(weight_concentration(r.weights)) == pytest.approx(1 / M)


def test_tau_zero_is_avg_and_tau_one_is_uwa():
    ups = gmm_uploads()
    avg = ProbabilityAveraging().aggregate(ups, context_for(ups))
    s0 = SmoothedUncertaintyWeighted(tau=0.0).aggregate(ups, context_for(ups))
    torch.testing.assert_close(s0.teacher, avg.teacher)
    torch.testing.assert_close(s0.weights, avg.weights)
    uwa = UncertaintyWeighted().aggregate(ups, context_for(ups))
    s1 = SmoothedUncertaintyWeighted(tau=1.0).aggregate(ups, context_for(ups))
    torch.testing.assert_close(s1.weights, uwa.weights)
    assert not torch.allclose(uwa.weights, avg.weights)
    # smoothing lowers concentration between the two extremes
    chi = [float(weight_concentration(SmoothedUncertaintyWeighted(tau=t).aggregate(ups, context_for(ups)).weights))
           for t in (0.0, 0.25, 1.0)]
    assert chi[0] == pytest.approx(1 / M) and chi[0] < chi[1] < chi[2] <= 1


def test_large_tau_picks_the_most_likely_client():
    ups = gmm_uploads()
    agg = SmoothedUncertaintyWeighted(tau=1e4)
    z = torch.stack([u["logits"] for u in ups])
    ll = agg.log_likelihoods(ups, z)
    r = agg.aggregate(ups, context_for(ups))
    best = ll.argmax(0)
    assert (r.weights.argmax(0) == best).all()
    assert float(r.weights.max(0).values.min()) > 0.99
    torch.testing.assert_close(r.teacher, z.softmax(-1)[best, torch.arange(N)], atol=1e-3, rtol=0)


def test_uwa_log_likelihood_matches_sklearn_gaussian_mixture():
    g = torch.Generator().manual_seed(3)
    classes = [1, 4, 7]
    y = torch.tensor(classes).repeat(30)
    z_cal = torch.randn(len(y), C, generator=g, dtype=torch.float64) * 1.5 + 3 * torch.nn.functional.one_hot(y, C)
    gmm = DiagonalGaussianMixture.fit(z_cal, y, classes)
    z = torch.randn(200, C, generator=g, dtype=torch.float64) * 3
    ours = gmm.log_likelihood(z).numpy()

    sk = GaussianMixture(n_components=3, covariance_type="diag")
    sk.weights_ = np.full(3, 1 / 3)
    sk.means_ = np.stack([z_cal[y == c].mean(0).numpy() for c in classes])
    sk.covariances_ = np.stack([z_cal[y == c].var(0, unbiased=False).numpy() for c in classes])
    sk.precisions_cholesky_ = 1 / np.sqrt(sk.covariances_)
    np.testing.assert_allclose(ours, sk.score_samples(z.numpy()), rtol=1e-9, atol=1e-7)


def test_density_rules_floor_and_dropped_components():
    z = torch.zeros(10, C)
    y = torch.tensor([0] * 9 + [1])  # class 0 constant logits, class 1 a single sample, class 2 absent
    gmm = DiagonalGaussianMixture.fit(z, y, [0, 1, 2], variance_floor=1e-3)
    assert gmm.classes.tolist() == [0] and gmm.dropped == 2
    assert torch.all(gmm.variances == 1e-3)
    assert torch.isfinite(gmm.log_likelihood(torch.randn(4, C))).all()
    empty = DiagonalGaussianMixture.fit(z, y, [5])
    assert torch.isneginf(empty.log_likelihood(torch.randn(4, C))).all()


def test_client_without_components_gets_zero_weight_and_all_empty_falls_back_to_uniform():
    ups = gmm_uploads()
    ups[0]["gmm_means"] = ups[0]["gmm_means"][:0]
    ups[0]["gmm_stds"] = ups[0]["gmm_stds"][:0]
    r = UncertaintyWeighted().aggregate(ups, context_for(ups))
    assert torch.all(r.weights[0] == 0)
    for u in ups:
        u["gmm_means"], u["gmm_stds"] = u["gmm_means"][:0], u["gmm_stds"][:0]
    r = UncertaintyWeighted().aggregate(ups, context_for(ups))
    torch.testing.assert_close(r.weights, torch.full((M, N), 1 / M))
    assert r.stats["density/uniform_fallback_samples"] == N


def test_scores_upload_gives_the_same_teacher_as_density_upload():
    ups = gmm_uploads()
    agg = UncertaintyWeighted()
    z = torch.stack([u["logits"] for u in ups])
    ll = agg.log_likelihoods(ups, z)
    score_ups = [Message({"logits": u["logits"], "log_likelihood": ll[i].float()},
                         metrics={"density/dropped_components": 0.0}) for i, u in enumerate(ups)]
    torch.testing.assert_close(UncertaintyWeighted(upload="scores").aggregate(score_ups, context_for(score_ups)).teacher,
                               agg.aggregate(ups, context_for(ups)).teacher, atol=1e-5, rtol=1e-5)


def density_case(scale, var_range, m=3, n=300, k=30, c=100, seed=0):
    """Mixtures shaped like trained logits: means ~ scale x one-hot + noise, variances log-uniform in
    var_range (1e-4 is the variance floor), public logits around random components, every 7th far out;
    one padded component."""
    g = torch.Generator().manual_seed(seed)
    classes = torch.stack([torch.randperm(c, generator=g)[:k] for _ in range(m)])
    means = scale * torch.nn.functional.one_hot(classes, c).double()
    means += scale / 5 * torch.randn(m, k, c, generator=g, dtype=torch.float64)
    lo, hi = (math.log(v) for v in var_range)
    var = torch.exp(torch.empty(m, k, c, dtype=torch.float64).uniform_(lo, hi, generator=g))
    pick = torch.randint(k, (n,), generator=g)
    z = means[:, pick] + torch.randn(m, n, c, generator=g, dtype=torch.float64) * var[:, pick].sqrt()
    z[:, ::7] *= 3
    valid = torch.ones(m, k, dtype=torch.bool)
    valid[0, -1] = False
    return z, means, var, valid


@pytest.mark.parametrize("scale, var_range, relative", [
    (10, (1e-4, 10), 1e-9),  # CIFAR-100-like: K = 30 of C = 100, some variances at the floor
    (100, (1e-4, 1e-2), 1e-8),
    (500, (1e-4, 1e-4), 1e-7),  # stress: components 5e4 standard deviations apart
])
def test_matmul_density_is_within_the_stated_tolerance_of_the_direct_form(scale, var_range, relative):
    z, means, var, valid = density_case(scale, var_range)
    fast = mixture_log_likelihood(z, means, var, valid, "matmul")
    ref = mixture_log_likelihood(z, means, var, valid, "direct")
    assert torch.isfinite(ref).all()
    # the documented bound: 1e-15 x T, T = max_k sum_d ((z - c)^2 + (mu_k - c)^2) / v_k
    w = valid[..., None].double()
    center = (means * w).sum(1, keepdim=True) / w.sum(1, keepdim=True)
    t = (((z - center) ** 2)[:, :, None, :] / var[:, None]).sum(-1) + ((means - center) ** 2 / var).sum(-1)[:, None]
    t = t.masked_fill(~valid[:, None], 0).amax(-1)
    diff = (fast - ref).abs()
    assert bool((diff <= 1e-15 * t).all()), float((diff / t).max())
    assert float((diff / (1 + ref.abs())).max()) <= relative
    assert torch.equal(fast, mixture_log_likelihood(z, means, var, valid, "matmul"))  # deterministic


def test_both_density_forms_give_the_same_suwa_teacher_and_padding_is_ignored():
    ups = gmm_uploads(k=3)
    ups[1]["gmm_means"], ups[1]["gmm_stds"] = ups[1]["gmm_means"][:1], ups[1]["gmm_stds"][:1]  # K differs: padded
    fast = SmoothedUncertaintyWeighted(density_method="matmul").aggregate(ups, context_for(ups))
    ref = SmoothedUncertaintyWeighted(density_method="direct").aggregate(ups, context_for(ups))
    torch.testing.assert_close(fast.weights, ref.weights, atol=1e-7, rtol=0)
    torch.testing.assert_close(fast.teacher, ref.teacher, atol=1e-7, rtol=0)
    z = torch.stack([u["logits"] for u in ups])
    ll = SmoothedUncertaintyWeighted().log_likelihoods(ups, z)
    alone = DiagonalGaussianMixture(ups[1]["gmm_means"].double(), ups[1]["gmm_stds"].double() ** 2,
                                    torch.tensor([0])).log_likelihood(z[1], "direct")
    torch.testing.assert_close(ll[1], alone, atol=1e-9, rtol=0)


@pytest.mark.parametrize("kwargs", [{"tau": -0.1}, {"tau": math.inf}, {"upload": "weights"}, {"variance_floor": 0},
                                    {"min_calibration_samples": 1}, {"density_method": "float16"}])
def test_bad_uwa_arguments(kwargs):
    with pytest.raises(ConfigError):
        SmoothedUncertaintyWeighted(**kwargs)


@pytest.mark.parametrize("tau", [1.0, 0.25])
def test_logit_mix_is_softmax_of_the_weighted_logit_sum(tau):
    """mix: logits is the workshop paper's Eq. 7 (Kovalchuk et al. 2025): p = softmax(sum_i w_i z_i)."""
    ups = gmm_uploads()
    z = torch.stack([u["logits"] for u in ups]).double()
    # weights computed here, one client at a time, from each client's own mixture
    ll = torch.stack([DiagonalGaussianMixture(u["gmm_means"].double(), u["gmm_stds"].double().pow(2),
                                              u["gmm_classes"]).log_likelihood(z[i]) for i, u in enumerate(ups)])
    w = torch.softmax(tau * ll, dim=0)
    expected = torch.einsum("mn,mnc->nc", w, z).softmax(-1)

    logit_mix = SmoothedUncertaintyWeighted(tau=tau, mix="logits").aggregate(ups, context_for(ups))
    prob_mix = SmoothedUncertaintyWeighted(tau=tau).aggregate(ups, context_for(ups))
    torch.testing.assert_close(logit_mix.teacher.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logit_mix.weights, prob_mix.weights)  # same weights, other space
    torch.testing.assert_close(logit_mix.teacher.sum(-1), torch.ones(N))
    assert (logit_mix.teacher - prob_mix.teacher).abs().max() > 0.05
    if tau == 1.0:
        torch.testing.assert_close(UncertaintyWeighted(mix="logits").aggregate(ups, context_for(ups)).teacher,
                                   logit_mix.teacher)


def test_logit_mix_with_tau_zero_is_logit_averaging():
    from fdlit.methods import LogitAveraging

    ups = gmm_uploads()
    torch.testing.assert_close(SmoothedUncertaintyWeighted(tau=0.0, mix="logits").aggregate(ups, context_for(ups)).teacher,
                               LogitAveraging().aggregate(ups, context_for(ups)).teacher)


@pytest.mark.parametrize("cls", [UncertaintyWeighted, SmoothedUncertaintyWeighted])
def test_bad_mix_is_refused_at_construction_naming_the_field_and_the_choices(cls):
    with pytest.raises(ConfigError, match=r"aggregator\.mix: allowed: 'probabilities', 'logits'; got 'logit'"):
        cls(mix="logit")


# ---------------------------------------------------------------- degenerate density fits (robust)
def test_robust_fit_drops_a_collapsed_client():
    z = torch.tensor([[3.0, -1.0, 0.5]]).repeat(12, 1)  # identical rows: the model ignores its input
    y = torch.tensor([0] * 6 + [2] * 6)
    plain = DiagonalGaussianMixture.fit(z, y, [0, 2])
    assert plain.classes.tolist() == [0, 2] and plain.floored == 6  # the paper's rule: all at the floor
    assert float(plain.log_likelihood(z[:1])) > 10  # a density spike wherever its logits land: everywhere
    gmm = DiagonalGaussianMixture.fit(z, y, [0, 2], robust=True)
    assert gmm.collapsed and gmm.dropped == 2 and len(gmm.means) == 0
    assert torch.isneginf(gmm.log_likelihood(z[:3])).all()  # weight 0


def test_robust_fit_gives_a_zero_spread_class_the_pooled_variance():
    g = torch.Generator().manual_seed(0)
    z = torch.cat([torch.randn(20, C, generator=g, dtype=torch.float64) * 2,
                   torch.randn(30, C, generator=g, dtype=torch.float64),
                   torch.full((15, C), 4.0, dtype=torch.float64)])  # class 7's logits never move
    y = torch.tensor([1] * 20 + [4] * 30 + [7] * 15)
    gmm = DiagonalGaussianMixture.fit(z, y, [1, 4, 7], robust=True)
    v1, v4 = z[:20].var(0, unbiased=False), z[20:50].var(0, unbiased=False)
    assert gmm.degenerate == 1 and gmm.shrunk == 0 and not gmm.collapsed and gmm.floored == 0
    torch.testing.assert_close(gmm.variances[2], (20 * v1 + 30 * v4) / 50)
    torch.testing.assert_close(gmm.variances[:2], torch.stack([v1, v4]))  # the others untouched
    torch.testing.assert_close(gmm.means[2], torch.full((C,), 4.0, dtype=torch.float64))


def test_robust_fit_shrinks_a_class_with_few_samples_toward_the_pooled_variance():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(34, C, generator=g, dtype=torch.float64)
    y = torch.tensor([0] * 30 + [5] * 4)
    gmm = DiagonalGaussianMixture.fit(z, y, [0, 5], robust=True, shrinkage_samples=10)
    v0, v5 = z[:30].var(0, unbiased=False), z[30:].var(0, unbiased=False)
    pooled = (30 * v0 + 4 * v5) / 34
    assert gmm.shrunk == 1 and gmm.degenerate == 0
    torch.testing.assert_close(gmm.variances[1], (4 * v5 + 10 * pooled) / 14)
    torch.testing.assert_close(gmm.variances[0], v0)
    off = DiagonalGaussianMixture.fit(z, y, [0, 5], robust=True, shrinkage_samples=0)
    torch.testing.assert_close(off.variances, DiagonalGaussianMixture.fit(z, y, [0, 5]).variances)


def test_robust_fit_is_the_plain_fit_when_nothing_is_degenerate():
    g = torch.Generator().manual_seed(2)
    y = torch.tensor([0, 3, 8]).repeat(20)
    z = torch.randn(60, C, generator=g) + 4 * torch.nn.functional.one_hot(y, C)
    a = DiagonalGaussianMixture.fit(z, y, [0, 3, 8, 9], robust=True)  # class 9: no sample, dropped as before
    b = DiagonalGaussianMixture.fit(z, y, [0, 3, 8, 9])
    assert torch.equal(a.means, b.means) and torch.equal(a.variances, b.variances) and a.dropped == b.dropped == 1
    assert (a.degenerate, a.shrunk, a.collapsed) == (0, 0, False)


def test_robust_uwa_counts_repairs_and_warns_once():
    ups = gmm_uploads()
    for u in ups:
        u.metrics.update({"density/collapsed_clients": 0, "density/degenerate_components": 0,
                          "density/shrunk_components": 0})
    ups[1].metrics["density/degenerate_components"] = 2
    agg = UncertaintyWeighted()
    with pytest.warns(RuntimeWarning, match="2 degenerate components"):
        stats = agg.aggregate(ups, context_for(ups)).stats
    assert stats["density/degenerate_components"] == 2 and stats["density/collapsed_clients"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agg.aggregate(ups, context_for(ups))
    with pytest.raises(ConfigError, match=r"aggregator\.shrinkage_samples"):
        UncertaintyWeighted(shrinkage_samples=-1)
