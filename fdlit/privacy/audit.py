"""Membership-inference audit of the client models: the loss-threshold attack of Yeom et al. 2018
(*Privacy risk in machine learning: analyzing the connection to overfitting*).

For client i, members are its private training samples, non-members the test samples of its own
classes (the same distribution, never trained on). The attack scores a sample by its negative
cross-entropy loss under the client's model (a member tends to have a lower loss); its AUC over
all thresholds is the Mann-Whitney statistic, P(score(member) > score(non-member)) + 0.5 P(tie).
0.5 is chance; 1.0 separates members perfectly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def membership_auc(member_scores: torch.Tensor, nonmember_scores: torch.Tensor) -> float:
    """AUC of the threshold attack: higher scores are guessed members (ties count half)."""
    m, n = member_scores.double().cpu(), nonmember_scores.double().cpu()
    if not len(m) or not len(n):
        return float("nan")
    greater = (m[:, None] > n[None, :]).double().sum()
    ties = (m[:, None] == n[None, :]).double().sum()
    return float((greater + 0.5 * ties) / (len(m) * len(n)))


def membership_audit(predict: Callable[[torch.Tensor], torch.Tensor], private: list[tuple[torch.Tensor, torch.Tensor]],
                     test_x: torch.Tensor, test_y: torch.Tensor, local_test_mask: torch.Tensor) -> dict:
    """Attack AUC per client and their mean. ``predict(x)`` gives every client's logits on x (M x n x C),
    wherever the clients live; ``local_test_mask`` (M x T) marks the test samples of each client's classes."""
    sizes = [len(x) for x, _ in private]
    xs = torch.cat([x for x, _ in private] + [test_x])
    ys = torch.cat([y for _, y in private] + [test_y])
    logits = predict(xs).float()  # M x (sum of private sizes + T) x C
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ys.repeat(len(private)), reduction="none").reshape(len(private), -1)
    aucs, start, t = [], 0, len(test_y)
    for i, n in enumerate(sizes):
        members = -loss[i, start:start + n]
        nonmembers = -loss[i, -t:][local_test_mask[i].bool()]
        aucs.append(membership_auc(members, nonmembers))
        start += n
    return {"privacy/mia_auc": float(torch.tensor(aucs).nanmean()), "clients/privacy/mia_auc": aucs}
