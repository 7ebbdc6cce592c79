"""What loss code does under torch.func.vmap on this torch (docs/vectorized-executor.md, "What a loss
may compute under vmap"): batched, slow per-client fallback (with torch's warning) or an error; and
the documented fast equivalents of the fallbacks compute the same values."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

M, B, K = 3, 6, 5
FALLBACK = "There is a performance drop because we have not yet implemented the batching rule"


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(M, B, K, generator=g)
    target = torch.randint(0, K, (M, B), generator=g)
    p = torch.softmax(torch.randn(M, B, K, generator=g), -1)
    p[0, 0, 0] = 0.0  # a zero probability (one_hot-like teachers)
    p[0, 0] /= p[0, 0].sum()
    w = (torch.rand(M, B, generator=g) > 0.3).float()
    return logits, target, p, w


def under_vmap(fn, *args):
    """(result, whether torch warned about a missing batching rule)."""
    torch._C._functorch._set_vmap_fallback_warning_enabled(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = vmap(fn, randomness="different")(*args)
    return out, any(FALLBACK in str(w.message) for w in caught)


BATCHED = {
    "cross_entropy": lambda z, t, p, w: (F.cross_entropy(z, t, reduction="none") * w).sum() / w.sum(),
    "cross_entropy soft": lambda z, t, p, w: F.cross_entropy(z, p),
    "label_smoothing": lambda z, t, p, w: F.cross_entropy(z, t, label_smoothing=0.1),
    "nll_loss": lambda z, t, p, w: F.nll_loss(F.log_softmax(z, -1), t),
    "mse": lambda z, t, p, w: F.mse_loss(z.softmax(-1), p),
    "huber": lambda z, t, p, w: F.huber_loss(z, p) + F.smooth_l1_loss(z, p) + F.l1_loss(z, p),
    "bce": lambda z, t, p, w: F.binary_cross_entropy_with_logits(z, p) + F.binary_cross_entropy(z.sigmoid(), p),
    "cosine": lambda z, t, p, w: F.cosine_similarity(z, p, dim=-1).sum() + F.normalize(z, dim=-1).sum(),
    "distances": lambda z, t, p, w: torch.cdist(z, p).sum() + F.pairwise_distance(z, p).sum(),
    "indexing": lambda z, t, p, w: z.gather(1, t[:, None]).sum() + z[torch.arange(B), t].sum(),
    "one_hot": lambda z, t, p, w: (F.one_hot(t, K) * z).sum(),
    "order": lambda z, t, p, w: z.topk(2, -1).values.sum() + z.sort(-1).values[:, -1].sum() + z.median(),
    "masked mean": lambda z, t, p, w: ((w > 0.5) * z.logsumexp(-1)).sum() / (w > 0.5).sum().clamp_min(1),
    "where": lambda z, t, p, w: torch.where(w > 0.5, z.logsumexp(-1), 0.0).sum(),
    "scatter": lambda z, t, p, w: torch.zeros(K).scatter_add(0, t, w).sum() + torch.zeros(K).index_add(0, t, w).sum(),
    "in-place on a batched tensor": lambda z, t, p, w: z.clone().mul_(2).sum(),
}
FALLBACKS = {
    "kl_div": lambda z, t, p, w: F.kl_div(F.log_softmax(z, -1), p, reduction="batchmean"),
    "kl_div log_target": lambda z, t, p, w: F.kl_div(F.log_softmax(z, -1), p.clamp_min(1e-12).log(),
                                                     reduction="batchmean", log_target=True),
    "bincount": lambda z, t, p, w: torch.bincount(t, minlength=K).float(),
    "histc": lambda z, t, p, w: torch.histc(z, bins=4),
    "quantile": lambda z, t, p, w: torch.quantile(z.flatten(), 0.3),
    "multi_margin_loss": lambda z, t, p, w: F.multi_margin_loss(z, t),
}
ERRORS = {
    "item": lambda z, t, p, w: z.sum() * z.sum().item(),
    "branch on a value": lambda z, t, p, w: z.sum() if z.sum() > 0 else -z.sum(),
    "boolean mask": lambda z, t, p, w: z[w > 0.5].sum(),
    "nonzero": lambda z, t, p, w: torch.nonzero(w).float().sum(),
    "unique": lambda z, t, p, w: torch.unique(t).float().sum(),
    "gaussian_nll_loss": lambda z, t, p, w: F.gaussian_nll_loss(z, p, torch.ones_like(z)),
    "in-place into an unbatched tensor": lambda z, t, p, w: torch.zeros(()).add_(z.sum()),
}


@pytest.mark.parametrize("name", list(BATCHED))
def test_batched_without_fallback(name, batch):
    out, slow = under_vmap(BATCHED[name], *batch)
    assert not slow
    loop = torch.stack([BATCHED[name](*(a[i] for a in batch)) for i in range(M)])
    torch.testing.assert_close(out, loop, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(FALLBACKS))
def test_slow_fallbacks_warn(name, batch):
    out, slow = under_vmap(FALLBACKS[name], *batch)
    assert slow  # when torch adds the batching rule, move the function in the docs' table
    loop = torch.stack([FALLBACKS[name](*(a[i] for a in batch)) for i in range(M)])
    torch.testing.assert_close(out, loop)


@pytest.mark.parametrize("name", list(ERRORS))
def test_not_allowed_under_vmap(name, batch):
    with pytest.raises(RuntimeError):
        vmap(ERRORS[name])(*batch)


def test_fast_equivalents_match_and_batch(batch):
    def kl(z, t, p, w):
        return (torch.xlogy(p, p) - p * F.log_softmax(z, -1)).sum(-1)

    def quantile(x, q):
        s = x.sort().values
        pos = q * (len(s) - 1)
        lo = int(pos)
        return s[lo] + (pos - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo])

    equivalents = {
        "kl_div": lambda z, t, p, w: kl(z, t, p, w).mean(),
        "bincount": lambda z, t, p, w: F.one_hot(t, K).sum(0).float(),
        "quantile": lambda z, t, p, w: quantile(z.flatten(), 0.3),
        "multi_margin_loss": lambda z, t, p, w: (((1 - z.gather(1, t[:, None]) + z).clamp_min(0).sum(1) - 1) / K).mean(),
    }
    for name, fn in equivalents.items():
        out, slow = under_vmap(fn, *batch)
        assert not slow, name
        expected, _ = under_vmap(FALLBACKS[name], *batch)
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5, msg=name)
    naive = vmap(lambda z, t, p, w: (p * (p.log() - F.log_softmax(z, -1))).sum(-1))(*batch)
    assert naive[0, 0].isnan() and not kl(*(a[0] for a in batch))[0].isnan()  # p = 0: xlogy, not p.log()
