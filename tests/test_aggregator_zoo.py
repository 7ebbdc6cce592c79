"""Defining properties of every aggregation rule in the zoo, on synthetic tensors (fast)."""

import math

import pytest
import torch
from scipy.stats import norm, spearmanr

from fdlit.errors import ConfigError
from fdlit.methods import (
    LKD,
    EntropyReduction,
    EntropyWeighted,
    FedGO,
    KuLSIF,
    LogitAveraging,
    LogitVariance,
    MetaModel,
    Oracle,
    ProbabilityAveraging,
    SelectiveFD,
)
from fdlit.methods.base import context_for
from fdlit.methods.fedgo import train_discriminator
from fdlit.methods.lkd import auc_against_unlabelled, one_vs_rest_auc

M, N, C = 5, 64, 10



def with_context(uploads):
    """(uploads, a server context for them): ``aggregate``'s arguments outside a run."""
    return uploads, context_for(uploads)


def logit_uploads(seed=0, m=M, n=N, c=C, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return [{"logits": torch.randn(n, c, generator=g) * scale} for _ in range(m)]


def stacked(uploads):
    return torch.stack([u["logits"] for u in uploads])


def assert_distribution(r, m=M, n=N):
    torch.testing.assert_close(r.teacher.sum(-1), torch.ones(n))
    if r.weights is not None:
        assert r.weights.shape == (m, n) and (r.weights >= 0).all()
        torch.testing.assert_close(r.weights.sum(0), torch.ones(n))


# ---------------------------------------------------------------- logit averaging
def test_logit_averaging_is_softmax_of_mean_logits_and_differs_from_avg():
    ups = logit_uploads()
    r = LogitAveraging().aggregate(ups, context_for(ups))
    assert_distribution(r)
    torch.testing.assert_close(r.teacher, stacked(ups).mean(0).softmax(-1))
    assert not torch.allclose(r.teacher, ProbabilityAveraging().aggregate(ups, context_for(ups)).teacher, atol=1e-3)
    # identical clients: logit averaging returns that client's softmax (T = 1)
    same = [{"logits": ups[0]["logits"]} for _ in range(M)]
    torch.testing.assert_close(LogitAveraging().aggregate(same, context_for(same)).teacher, ups[0]["logits"].softmax(-1))
    hot = LogitAveraging(temperature=0.5).aggregate(ups, context_for(ups)).teacher
    assert (hot.max(-1).values >= r.teacher.max(-1).values - 1e-6).all()


# ---------------------------------------------------------------- ERA
def test_era_sharpens_avg_and_keeps_its_argmax():
    ups = logit_uploads()
    avg = ProbabilityAveraging().aggregate(ups, context_for(ups)).teacher
    r = EntropyReduction(temperature=0.1).aggregate(ups, context_for(ups))
    assert_distribution(r)
    torch.testing.assert_close(r.teacher, torch.softmax(avg / 0.1, -1))
    assert (r.teacher.argmax(-1) == avg.argmax(-1)).all()

    def entropy(p):
        return -(p * p.clamp_min(1e-30).log()).sum(-1)

    # T = 0.1 at C = 10: the top probability rises on every sample, the entropy on average ...
    assert (r.teacher.max(-1).values > avg.max(-1).values).all()
    assert entropy(r.teacher).mean() < entropy(avg).mean()
    # ... and a lower T lowers the entropy of every sample (T = 0.1 ~ 1/C is close to the identity
    # near uniform: exp((p_a - p_b) / T) ~ p_a / p_b there, see the class docstring)
    sharp = EntropyReduction(temperature=0.05).aggregate(ups, context_for(ups)).teacher
    assert (entropy(sharp) < entropy(avg)).all()


# ---------------------------------------------------------------- entropy weighting
def test_entropy_weighting_trusts_the_confident_client():
    ups = logit_uploads(scale=0.1)  # everyone nearly uniform ...
    ups[2]["logits"] = ups[2]["logits"].clone()
    ups[2]["logits"][:, 3] += 8.0  # ... except client 2, confident on class 3
    r = EntropyWeighted().aggregate(ups, context_for(ups))
    assert_distribution(r)
    assert (r.weights.argmax(0) == 2).all()
    torch.testing.assert_close(r.teacher, torch.einsum("mn,mnc->nc", r.weights, stacked(ups).softmax(-1)))
    # equal entropies (permuted logits) -> uniform weights
    base = torch.randn(N, C)
    perm = [{"logits": base[:, torch.randperm(C)]} for _ in range(M)]
    torch.testing.assert_close(EntropyWeighted().aggregate(perm, context_for(perm)).weights, torch.full((M, N), 1 / M))


# ---------------------------------------------------------------- logit variance
def test_logit_variance_weights_are_proportional_to_variance():
    ups = logit_uploads()
    r = LogitVariance(eps=0.0).aggregate(ups, context_for(ups))
    assert_distribution(r)
    var = stacked(ups).var(-1, unbiased=False)
    torch.testing.assert_close(r.weights, var / var.sum(0))
    ups[1]["logits"] = ups[1]["logits"] * 3  # 9x the variance of its previous self
    r2 = LogitVariance(eps=0.0).aggregate(ups, context_for(ups))
    assert (r2.weights[1] > r.weights[1]).all()
    flat = [{"logits": torch.zeros(N, C)} for _ in range(M)]  # zero variance everywhere: uniform
    torch.testing.assert_close(LogitVariance(eps=0.0).aggregate(flat, context_for(flat)).weights, torch.full((M, N), 1 / M))


# ---------------------------------------------------------------- Oracle
def test_oracle_puts_zero_weight_on_clients_lacking_the_class():
    ups = logit_uploads()
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, C, (N,), generator=g)
    classes = torch.zeros(M, C, dtype=torch.bool)
    for i in range(M):
        classes[i, [(2 * i) % C, (2 * i + 1) % C]] = True  # client i holds classes 2i, 2i+1
    agg = Oracle()
    agg.set_truth(y, classes)
    r = agg.aggregate(ups, context_for(ups))
    assert_distribution(r)
    holds = classes[:, y]
    assert (r.weights[~holds] == 0).all()
    assert (r.weights[holds] > 0).all()
    # exactly one holder per class here: the teacher is that client's prediction
    holder = holds.float().argmax(0)
    torch.testing.assert_close(r.teacher, stacked(ups).softmax(-1)[holder, torch.arange(N)])


def test_oracle_refuses_to_run_without_labels():
    with pytest.raises(RuntimeError, match="public labels"):
        Oracle().aggregate(*with_context(logit_uploads()))


# ---------------------------------------------------------------- KuLSIF
def test_kulsif_ranks_points_like_the_true_density_ratio():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 1, generator=g)  # p = N(0, 1)
    a = torch.randn(400, 1, generator=g) * 2.0  # u = N(0, 4)
    est = KuLSIF.fit(x, a)
    t = torch.randn(500, 1, generator=g) * 2.0
    true_log_ratio = norm.logpdf(t.numpy()[:, 0]) - norm.logpdf(t.numpy()[:, 0], scale=2.0)
    rho = spearmanr(est(t).numpy(), true_log_ratio).correlation
    assert rho > 0.9


# ---------------------------------------------------------------- Selective-FD
def selective_uploads(masks, hard=False, seed=0):
    ups = logit_uploads(seed)
    out = []
    for u, mk in zip(ups, masks, strict=True):
        if hard:
            out.append({"logits": u["logits"][:0], "labels": u["logits"][mk].argmax(-1).to(torch.uint8), "mask": mk})
        else:
            out.append({"logits": u["logits"][mk], "mask": mk})
    return ups, out


def test_selective_fd_with_every_mask_on_equals_avg():
    masks = torch.ones(M, N, dtype=torch.bool)
    ups, sel = selective_uploads(masks)
    r = SelectiveFD(server_threshold=2.0).aggregate(sel, context_for(sel))
    avg = ProbabilityAveraging().aggregate(ups, context_for(ups))
    torch.testing.assert_close(r.teacher, avg.teacher)
    torch.testing.assert_close(r.weights, avg.weights)
    assert r.keep.all()


def test_selective_fd_averages_only_kept_predictions_and_drops_uncovered_and_ambiguous():
    g = torch.Generator().manual_seed(3)
    masks = torch.rand(M, N, generator=g) > 0.5
    masks[:, 0] = False  # nobody keeps sample 0
    ups, sel = selective_uploads(masks)
    r = SelectiveFD(server_threshold=2.0).aggregate(sel, context_for(sel))
    q = stacked(ups).softmax(-1)
    for x in range(1, N):
        if masks[:, x].any():
            torch.testing.assert_close(r.teacher[x], q[masks[:, x], x].mean(0))
    assert not r.keep[0] and r.keep[1:].eq(masks[:, 1:].any(0)).all()
    assert_distribution(r)
    # the server selector drops exactly the samples with 2 (1 - max P) > tau_server
    strict = SelectiveFD(server_threshold=1.0).aggregate(sel, context_for(sel))
    ambiguous = 2 * (1 - r.teacher.max(-1).values) > 1.0
    assert (strict.keep == (r.keep & ~ambiguous)).all()
    assert (~strict.keep).sum() > (~r.keep).sum()


def test_selective_fd_hard_labels_vote_and_send_one_hot():
    masks = torch.ones(M, N, dtype=torch.bool)
    ups, sel = selective_uploads(masks, hard=True)
    r = SelectiveFD(labels="hard", server_threshold=2.0).aggregate(sel, context_for(sel))
    votes = torch.nn.functional.one_hot(stacked(ups).argmax(-1), C).float().mean(0)
    tied = (votes == votes.max(-1, keepdim=True).values).sum(-1) > 1
    assert tied.any() and (~tied).any()  # the synthetic votes have both
    assert (r.keep == ~tied).all()  # a tied vote is dropped, never given to the lowest class id
    kept = r.teacher[r.keep]
    assert ((kept == 0) | (kept == 1)).all()
    assert (kept.argmax(-1) == votes[r.keep].argmax(-1)).all()
    soft = SelectiveFD(labels="hard", server_threshold=2.0, ties="soft").aggregate(sel, context_for(sel))
    assert soft.keep.all()
    torch.testing.assert_close(soft.teacher[tied], votes[tied])  # the vote fractions themselves
    # a sample where 3 of 5 clients agree survives tau_server = 0.8 (2 * (1 - 0.6)); 2 of 5 does not
    r2 = SelectiveFD(labels="hard", server_threshold=0.8).aggregate(sel, context_for(sel))
    assert (r2.keep == ((votes.max(-1).values >= 0.6 - 1e-6) & ~tied)).all()


def test_selective_fd_client_selector_keeps_in_distribution_public_samples():
    # client data around +3 in every feature; public set half near +3, half near -3
    g = torch.Generator().manual_seed(0)
    d = 4
    train_x = torch.randn(80, d, generator=g) * 0.5 + 3
    cal_x = torch.randn(20, d, generator=g) * 0.5 + 3
    public = torch.cat([torch.randn(50, d, generator=g) * 0.5 + 3, torch.randn(50, d, generator=g) * 0.5 - 3])
    agg = SelectiveFD(client_quantile=0.25)
    mask = agg.client_part().client_mask(train_x, torch.zeros(80, dtype=torch.long), cal_x, torch.zeros(20, dtype=torch.long),
                           [0], public)
    assert mask[50:].sum() == 0  # never keeps the far-away half
    assert mask[:50].float().mean() > 0.5  # keeps most of its own distribution (quantile 0.25)


@pytest.mark.parametrize("kwargs, field", [
    ({"labels": "fuzzy"}, "aggregator.labels"),
    ({"client_quantile": 1.0}, "aggregator.client_quantile"),
    ({"server_threshold": 0.0}, "aggregator.server_threshold"),
    ({"server_threshold": 2.5}, "aggregator.server_threshold"),
    ({"auxiliary": "gaussian"}, "aggregator.auxiliary"),
    ({"aux_samples": 1}, "aggregator.aux_samples"),
    ({"sigma": -1.0}, "aggregator.sigma"),
    ({"lam": 0.0}, "aggregator.lam"),
    ({"ties": "lowest"}, "aggregator.ties"),
])
def test_selective_fd_rejects_bad_arguments(kwargs, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        SelectiveFD(**kwargs)


@pytest.mark.parametrize("cls, kwargs, field", [
    (LogitAveraging, {"temperature": 0.0}, "aggregator.temperature"),
    (EntropyReduction, {"temperature": -1.0}, "aggregator.temperature"),
    (EntropyWeighted, {"temperature": math.inf}, "aggregator.temperature"),
    (LogitVariance, {"eps": -1.0}, "aggregator.eps"),
])
def test_simple_rules_reject_bad_arguments(cls, kwargs, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        cls(**kwargs)


# ---------------------------------------------------------------- FedGO
def test_fedgo_with_equal_odds_and_equal_counts_is_avg():
    ups = logit_uploads()
    agg = FedGO()
    agg.set_discriminator_scores(torch.full((M, N), 0.7), torch.full((M,), 100))
    r = agg.aggregate(ups, context_for(ups))
    avg = ProbabilityAveraging().aggregate(ups, context_for(ups))
    torch.testing.assert_close(r.teacher, avg.teacher)
    torch.testing.assert_close(r.weights, avg.weights)


def test_fedgo_weights_are_n_times_odds_normalised():
    g = torch.Generator().manual_seed(2)
    d = torch.rand(M, N, generator=g) * 0.98 + 0.01  # discriminator outputs in (0, 1)
    n_k = torch.tensor([10, 20, 30, 40, 50])
    agg = FedGO()
    agg.set_discriminator_scores(torch.logit(d.double()), n_k)
    r = agg.aggregate(*with_context(logit_uploads()))
    odds = d.double() / (1 - d.double())
    expected = n_k[:, None] * odds / (n_k[:, None] * odds).sum(0)
    torch.testing.assert_close(r.weights, expected.float())
    assert_distribution(r)


def test_fedgo_discriminator_separates_own_data_from_reference():
    g = torch.Generator().manual_seed(0)
    own = torch.randn(200, 4, generator=g) + 2.0
    ref = torch.cat([torch.randn(100, 4, generator=g) + 2.0, torch.randn(100, 4, generator=g) - 2.0])
    net = train_discriminator(own, ref, epochs=20, seed=0)
    with torch.no_grad():
        s = net(ref)[:, 0]
    # odds ~ p_own / p_ref: about 2 on the shared half (own density twice the reference's), ~0 elsewhere
    assert abs(float(s[:100].mean()) - math.log(2.0)) < 0.35
    assert float(s[100:].mean()) < float(s[:100].mean()) - 3.0


def test_fedgo_rejects_bad_arguments_and_needs_discriminators():
    for kwargs, field in (({"hidden": 0}, "hidden"), ({"epochs": 0}, "epochs"), ({"lr": 0.0}, "lr"),
                          ({"upload": "model"}, "upload")):
        with pytest.raises(ConfigError, match=f"aggregator\\.{field}"):
            FedGO(**kwargs)
    with pytest.raises(RuntimeError, match="discriminators"):
        FedGO().aggregate(*with_context(logit_uploads()))


# ---------------------------------------------------------------- LKD
def test_one_vs_rest_auc_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (60,), generator=g)
    s = torch.randn(60, 4, generator=g) + torch.nn.functional.one_hot(y, 4)
    s[:10, 0] = 0.25  # ties
    auc = one_vs_rest_auc(s, y, 4)
    for c in range(4):
        assert float(auc[c]) == pytest.approx(roc_auc_score((y == c).numpy(), s[:, c].numpy()), abs=1e-6)
    batched = one_vs_rest_auc(torch.stack([s, -s]), y, 4)
    torch.testing.assert_close(batched[0], auc)
    torch.testing.assert_close(batched[1], 1 - auc)


def test_lkd_trusts_each_client_on_the_classes_it_is_reliable_for():
    # client i is perfect (AUC 1) on class i and useless (AUC 0.5) elsewhere
    auc = torch.full((M, C), 0.5)
    auc[torch.arange(M), torch.arange(M)] = 1.0
    ups = logit_uploads()
    for u, a in zip(ups, auc, strict=True):
        u["class_auc"] = a
    r = LKD(temperature=20.0).aggregate(ups, context_for(ups))
    assert_distribution(r)
    beta = torch.softmax(20 * auc, 0)
    pred = stacked(ups).argmax(-1)
    w = beta[torch.arange(M)[:, None], pred]
    torch.testing.assert_close(r.weights, w / w.sum(0))
    # sample 0: client 0 predicts class 0 (its reliable class, beta ~ 1); the others predict class 9,
    # on which all are equally reliable (beta = 1/M each): client 0 gets 1 / (1 + (M-1)/M)
    for u in ups:
        u["logits"][0] = torch.nn.functional.one_hot(torch.tensor(9), C).float() * 5
    ups[0]["logits"][0] = torch.nn.functional.one_hot(torch.tensor(0), C).float() * 5
    r = LKD(temperature=20.0).aggregate(ups, context_for(ups))
    assert float(r.weights[0, 0]) == pytest.approx(1 / (1 + (M - 1) / M), rel=1e-4)


def test_lkd_client_auc_marks_unseen_classes_lowest():
    probs = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.7, 0.3, 0.0]])
    auc = LKD.client_auc(probs, torch.tensor([0, 1, 0]), [0, 1], 3)
    torch.testing.assert_close(auc, torch.tensor([1.0, 1.0, 0.0]))
    single = LKD.client_auc(probs[:1], torch.tensor([0]), [0], 3)  # k = 1: undefined -> 1
    torch.testing.assert_close(single, torch.tensor([1.0, 0.0, 0.0]))


def test_auc_against_unlabelled_is_an_affine_map_of_the_true_auc():
    """Positives against an unlabelled set that holds a copy of them (fraction pi) and the negatives:
    AUC_PU = pi / 2 + (1 - pi) * AUC (the identity behind LKD's calibration_vs_public scoring)."""
    from sklearn.metrics import roc_auc_score

    g = torch.Generator().manual_seed(0)
    pos = torch.randn(40, generator=g, dtype=torch.float64) + 1.0
    neg = torch.randn(160, generator=g, dtype=torch.float64)
    neg[:5] = pos[:5]  # ties count 1/2
    true_auc = roc_auc_score([1] * 40 + [0] * 160, torch.cat([pos, neg]).numpy())
    pi = 40 / 200
    pu = float(auc_against_unlabelled(pos, torch.cat([pos, neg])[torch.randperm(200, generator=g)]))
    assert pu == pytest.approx(pi / 2 + (1 - pi) * true_auc, abs=1e-12)
    assert float(auc_against_unlabelled(pos, neg)) == pytest.approx(true_auc, abs=1e-12)


def test_lkd_public_scoring_marks_unseen_classes_zero_and_classes_without_samples_half():
    g = torch.Generator().manual_seed(1)
    cal, pub = torch.randn(6, 4, generator=g), torch.randn(30, 4, generator=g)
    cal[:3, 0] += 10  # class 0 calibration samples score above every public sample on output 0
    auc = LKD.client_auc_vs_public(cal, torch.tensor([0, 0, 0, 1, 1, 1]), pub, [0, 1, 2], 4)
    assert float(auc[0]) == 1.0 and 0 < float(auc[1]) < 1
    assert float(auc[2]) == 0.5 and float(auc[3]) == 0.0  # local without samples; never seen


def test_lkd_rejects_bad_arguments():
    for kwargs, field in (({"temperature": 0.0}, "temperature"), ({"scoring": "labels"}, "scoring"),
                          ({"server_labelled_size": 1}, "server_labelled_size")):
        with pytest.raises(ConfigError, match=f"aggregator\\.{field}"):
            LKD(**kwargs)
    with pytest.raises(ConfigError, match="allowed: 'calibration_vs_public', 'calibration', 'server'"):
        LKD(scoring="public")


# ---------------------------------------------------------------- Meta-Model
def expert_logits(y, m, c, g):
    """Client i is an expert for class i only: a large logit i when y == i, noise elsewhere; every
    client otherwise votes for a random class with confidence, so averaging is fooled."""
    z = torch.randn(m, len(y), c, generator=g)
    wrong = torch.randint(0, c, (m, len(y)), generator=g)
    z += 4 * torch.nn.functional.one_hot(wrong, c)
    for i in range(m):
        z[i, y == i] = 0.3 * torch.randn(int((y == i).sum()), c, generator=g)
        z[i, y == i, i] += 8
    return z


def test_meta_model_recovers_the_true_label_on_a_separable_toy_problem():
    g = torch.Generator().manual_seed(0)
    m = c = 4
    y_lab, y_pub = torch.randint(0, c, (200,), generator=g), torch.randint(0, c, (300,), generator=g)
    z_lab, z_pub = expert_logits(y_lab, m, c, g), expert_logits(y_pub, m, c, g)
    ups = [{"logits": z_pub[i], "mm_logits": z_lab[i]} for i in range(m)]
    agg = MetaModel(steps=200)
    agg.set_labels(y_lab)
    r = agg.aggregate(ups, context_for(ups))
    torch.testing.assert_close(r.teacher.sum(-1), torch.ones(300))
    acc = float((r.teacher.argmax(-1) == y_pub).float().mean())
    avg_acc = float((ProbabilityAveraging().aggregate(ups, context_for(ups)).teacher.argmax(-1) == y_pub).float().mean())
    assert acc > 0.95 and acc > avg_acc + 0.2


@pytest.mark.parametrize("hidden", [64, 0])
def test_meta_model_fit_equals_torch_optim_adam_bit_for_bit(hidden):
    """The fit runs Adam's update in its functional form: the weights equal torch.optim.Adam's loop."""
    g = torch.Generator().manual_seed(3)
    features, labels = torch.randn(120, 40, generator=g), torch.randint(0, 5, (120,), generator=g)
    agg = MetaModel(hidden=hidden, steps=60, lr=0.02, weight_decay=1e-3)
    got = agg.fit_meta_model(features, labels, 5, seed=11)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        body = [torch.nn.Linear(40, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 5)] if hidden else [torch.nn.Linear(40, 5)]
        ref = torch.nn.Sequential(*body)
    opt = torch.optim.Adam(ref.parameters(), lr=0.02, weight_decay=1e-3)
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(ref(features), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for (name, a), b in zip(got.state_dict().items(), ref.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_meta_model_rejects_bad_arguments_and_needs_labels():
    for kwargs, field in (({"labelled_per_client": 0}, "labelled_per_client"), ({"hidden": -1}, "hidden"),
                          ({"steps": 0}, "steps"), ({"lr": -1.0}, "lr")):
        with pytest.raises(ConfigError, match=f"aggregator\\.{field}"):
            MetaModel(**kwargs)
    with pytest.raises(RuntimeError, match="labelled set"):
        MetaModel().aggregate(*with_context(logit_uploads()))


def test_meta_model_labelled_size_is_a_total_split_over_the_clients():
    agg = MetaModel(labelled_size=3000)
    assert [agg.client_part().client_share(i, 20) for i in range(20)] == [150] * 20  # the workshop paper's 3,000 at M = 20
    agg = MetaModel(labelled_size=7)
    assert [agg.client_part().client_share(i, 3) for i in range(3)] == [3, 2, 2]
    assert [MetaModel().client_part().client_share(i, 4) for i in range(4)] == [15] * 4  # neither given: 15 each
    assert MetaModel(labelled_per_client=4).client_part().client_share(0, 20) == 4
    with pytest.raises(ConfigError, match=r"aggregator\.labelled_size: give the total .* not both"):
        MetaModel(labelled_per_client=15, labelled_size=3000)
    with pytest.raises(ConfigError, match=r"aggregator\.labelled_size: must be >= 1"):
        MetaModel(labelled_size=0)


def test_meta_model_labelled_size_sets_the_pooled_set_in_a_run(tmp_path):
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    argv = ["--config", "digits_meta_model.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", "1", "--federation.private_epochs_first", "1",
            "--federation.public_epochs_first", "0", "--data.num_clients", "4", "--data.classes_per_client", "3",
            "--data.public_size", "120", "--model.hidden", "[16]",
            "--aggregator.labelled_per_client", "null", "--aggregator.labelled_size", "30"]
    experiment = Experiment(parse_fit(argv)[1])
    experiment.fit()
    loop = experiment.loop
    sent = [m.shape[0] for m in loop.server_side.ledger.messages if m.kind == "mm_labels"]
    assert sent == [8, 8, 7, 7]
    assert loop.history[-1]["mm/labelled_size"] == 30.0
