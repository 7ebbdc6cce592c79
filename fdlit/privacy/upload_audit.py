"""Audits of what federated distillation shares: attacks on the clients' predictions (Shi et al. 2025,
arXiv 2502.08001, attack three FD methods' public-set predictions this way), beside the loss-threshold audit of the client
models (fdlit.privacy.audit).

**Label-distribution inference** (every round, on what the server received). The attacker (the
server) estimates client i's class histogram from its public-set upload as the histogram of the
classes its model predicts, h_i[c] = (1/N) #{x : argmax z_i(x) = c} (it errs less than the mean
predicted distribution, which a model spreads over every class). Its error is the total-variation
distance to the true histogram of the client's private training labels, TV = 0.5 ||h_i - h_i*||_1 in [0, 1]; the chance baseline is the guess that knows
nothing, the uniform histogram. Under label skew (k classes per client) a model trained on k classes
predicts mostly those, so the attack's error sits far below chance; noise on the upload
(differential privacy) scatters the predicted classes and pushes the error toward chance.

**Membership inference from predictions** (every round, on the client models that made the round's
uploads: queried right after the private phase, before distillation changes them). The attacker
queries client i's model on candidate samples (as a server could by placing them in the public set)
and decides whether each was in the client's training data: members are the client's private
samples, non-members the test samples of its classes (at most ``cap`` of each, the first ones). The
test is the offline likelihood-ratio attack (LiRA, Carlini et al. 2022, *Membership inference attacks
from first principles*) with the other clients as shadow models (the shadow-model attack of Shokri et
al. 2017): a sample's score is the client's scaled confidence phi_i(x) = log p_i(y|x) - log(1 - p_i(y|x))
minus the mean phi_j(x) of the shadows, the other clients that hold class y (every other client
where fewer than two do) and **never trained on x** (a sample held by several clients, as the class
partition draws them, is no shadow's for those clients); a single global variance, so the test's normalisation drops out of AUC and TPR. A target
with no such shadow is not scored (``privacy/upload_mia_unscored``: the fraction of member targets
left out; where clients of a class share most samples, as on digits, most members are). Reported:
the attack's AUC (0.5: chance) and its true-positive rate at a 1 % false-positive rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fdlit.privacy.audit import membership_auc

FPR = 0.01  # the false-positive rate the TPR is reported at


def label_histograms(labels: Sequence[torch.Tensor], num_classes: int) -> list[torch.Tensor]:
    return [torch.bincount(y.long().cpu(), minlength=num_classes).double() / max(len(y), 1) for y in labels]


def label_inference(logits: Sequence[torch.Tensor], histograms: Sequence[torch.Tensor]) -> dict:
    """The attack's TV error per client (``logits``: what each client uploaded, N x C; ``histograms``:
    each client's true class histogram), their mean and the chance baseline's."""
    errors, chance = [], []
    for z, true in zip(logits, histograms, strict=True):
        guess = torch.bincount(z.cpu().argmax(-1), minlength=len(true)).double() / max(len(z), 1)
        errors.append(0.5 * float((guess - true).abs().sum()))
        chance.append(0.5 * float((torch.full_like(true, 1 / len(true)) - true).abs().sum()))
    return {"privacy/label_tv": sum(errors) / len(errors), "privacy/label_tv_chance": sum(chance) / len(chance),
            "clients/privacy/label_tv": errors}


def tpr_at_fpr(members: torch.Tensor, nonmembers: torch.Tensor, fpr: float = FPR) -> float:
    """True-positive rate at the threshold that flags at most ``fpr`` of the non-members."""
    if not len(members) or not len(nonmembers):
        return float("nan")
    ranked = nonmembers.double().sort(descending=True).values
    allowed = int(fpr * len(ranked))  # non-members allowed above the threshold
    threshold = ranked[allowed] if allowed < len(ranked) else -torch.inf
    return float((members.double() > threshold).double().mean())


def scaled_confidence(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """LiRA's phi = log p(y|x) - log(1 - p(y|x)), computed stably from logits (... x n x C)."""
    z = logits.double()
    true = z.gather(-1, labels.expand(*z.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    others = z.scatter(-1, labels.expand(*z.shape[:-1]).unsqueeze(-1), -torch.inf).logsumexp(-1)
    return true - others


def holders(private: list[tuple[torch.Tensor, torch.Tensor]], xs: torch.Tensor) -> torch.Tensor:
    """targets x M: whether client j trained on target x (the same input in its private set)."""
    key = [{row.tobytes() for row in x.detach().cpu().numpy().reshape(len(x), -1)} for x, _ in private]
    rows = xs.detach().cpu().numpy().reshape(len(xs), -1)
    return torch.tensor([[row.tobytes() in k for k in key] for row in rows], dtype=torch.bool)


def prediction_membership(predict: Callable[[torch.Tensor], torch.Tensor], private: list[tuple[torch.Tensor, torch.Tensor]],
                          test_x: torch.Tensor, test_y: torch.Tensor, local_test_mask: torch.Tensor,
                          cap: int = 200) -> dict:
    """The attack of the module docstring on every client; ``predict(x)`` gives every client's logits on
    x (M x n x C), ``local_test_mask`` (M x T) marks each client's test classes."""
    m = len(private)
    members = [(x[:cap], y[:cap]) for x, y in private]
    rows = [local_test_mask[i].bool().nonzero().flatten()[:cap] for i in range(m)]
    test_rows = torch.unique(torch.cat(rows)) if rows else torch.empty(0, dtype=torch.long)
    xs = torch.cat([x for x, _ in members] + [test_x[test_rows]])
    ys = torch.cat([y for _, y in members] + [test_y[test_rows]]).long()
    if m < 2:  # no shadow model
        return {}
    logits = predict(xs)
    phi = scaled_confidence(logits, ys).cpu()  # M x targets
    c = logits.shape[-1]
    holds = torch.stack([torch.bincount(y.long().cpu(), minlength=c) > 0 for _, y in private])  # M x C
    saw = holders(private, xs)  # targets x M
    ys = ys.cpu()
    position = {int(r): len(xs) - len(test_rows) + j for j, r in enumerate(test_rows.tolist())}
    aucs, tprs, unscored, start = [], [], [], 0
    for i, (x, _) in enumerate(members):
        targets = list(range(start, start + len(x))) + [position[int(r)] for r in rows[i]]
        start += len(x)
        t = torch.tensor(targets, dtype=torch.long)
        shadows = holds[:, ys[t]].T.clone()  # targets x M: the other clients that hold the target's class ...
        shadows[:, i] = False
        few = shadows.sum(1) < 2  # ... or every other client where fewer than two do (alike for members and not)
        shadows[few] = True
        shadows[few, i] = False
        shadows &= ~saw[t]  # and never trained on the target
        scored = shadows.any(1)
        reference = (phi[:, t].T * shadows).sum(1) / shadows.sum(1).clamp_min(1)
        score = phi[i, t] - reference
        member = torch.arange(len(t)) < len(x)
        unscored.append(float((member & ~scored).sum()) / max(len(x), 1))
        aucs.append(membership_auc(score[member & scored], score[~member & scored]))
        tprs.append(tpr_at_fpr(score[member & scored], score[~member & scored]))
    mean = torch.tensor(aucs).nanmean()
    return {"privacy/upload_mia_auc": float(mean), "privacy/upload_mia_tpr_at_1fpr": float(torch.tensor(tprs).nanmean()),
            "privacy/upload_mia_unscored": sum(unscored) / len(unscored), "clients/privacy/upload_mia_auc": aucs}
