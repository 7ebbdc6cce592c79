"""LKD: label-driven class-reliability weighting (F2L, Nguyen et al. 2022, Sec. 3.2-3.3)."""

from __future__ import annotations

import math
from typing import Literal

import torch

from fdlit.aggregators.base import AggregationResult, Aggregator
from fdlit.errors import ConfigError, check_at_least, check_number


def one_vs_rest_auc(scores: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """ROC-AUC of ``scores[..., c]`` for class c against the rest, batched: scores (..., L, C) -> (..., C).

    The Mann-Whitney form, P(s_pos > s_neg) + P(s_pos = s_neg) / 2, over all positive-negative pairs
    (ties count 1/2, as sklearn's roc_auc_score). A class without positives or without negatives
    has no AUC: NaN.
    """
    pos = torch.nn.functional.one_hot(labels.long(), num_classes).to(scores.dtype)  # L x C
    neg = 1.0 - pos
    diff = scores[..., :, None, :] - scores[..., None, :, :]  # ..., L(a) x L(b) x C
    wins = (torch.sign(diff) + 1.0) / 2.0
    total = torch.einsum("...abc,ac,bc->...c", wins, pos, neg)
    pairs = pos.sum(0) * neg.sum(0)
    return torch.where(pairs > 0, total / pairs.clamp_min(1), torch.full_like(total, math.nan))


class LKDAggregator(Aggregator):
    """LKD class reliability (Nguyen et al., F2L, *Label-driven Knowledge Aggregator*; Sec. 3.3,
    Eq. 7 and Algorithm 6):

        beta[i, c] = softmax_i( T_w * AUC_{i,c} ),   w_i(x) = beta[i, argmax_c Q_i(x)],
        W[i, x] = w_i(x) / sum_j w_j(x),             P(x) = sum_i W[i, x] Q_i(x)

    where AUC_{i,c} is the one-vs-rest ROC-AUC of client i's class-c probability on a labelled set
    (F2L: T_w = 20). A client is trusted on x according to how reliable it is on the class it predicts.

    **choice** (docs/algorithms.md) of the labelled set, ``scoring``:
      - ``calibration`` (default, no labels leave the clients): every client scores itself on its own
        calibration split after each private phase and uploads its C AUCs. Classes it never saw get
        AUC 0 (the lowest reliability); a local class whose AUC is undefined because the client has a
        single class (k = 1) gets AUC 1 (its classifier is never wrong on its own data). With
        T_w = 20 this makes beta ~ uniform over the holders of class c: w_i(x) ~ 1[argmax Q_i(x) in C_i].
      - ``server``: as in F2L, the server holds a labelled set: ``server_labelled_size`` samples of
        the public set *with their labels* (this mode uses public labels for training the
        aggregator; say so when reporting it). Their inputs are broadcast once (round 0, counted);
        every round each client uploads its logits on them (L x C, counted) and the server computes
        the AUCs. A class absent from the labelled set gets AUC 0.5 for everyone.

    AUCs are computed in torch (:func:`one_vs_rest_auc`), batched over clients in ``server`` mode.

    Args:
        temperature: T_w > 0 (F2L: 20).
        scoring: ``calibration`` or ``server``.
        server_labelled_size: L, for ``scoring: server`` (>= 2).
    """

    short_name = "lkd"

    def __init__(self, temperature: float = 20.0, scoring: Literal["calibration", "server"] = "calibration",
                 server_labelled_size: int = 100):
        check_number("aggregator.temperature", temperature)
        if scoring not in ("calibration", "server"):
            raise ConfigError("aggregator.scoring", f"allowed: 'calibration', 'server'; got {scoring!r}")
        check_at_least("aggregator.server_labelled_size", server_labelled_size, 2)
        self.temperature = temperature
        self.scoring = scoring
        self.server_labelled_size = server_labelled_size
        self.labelled_y: torch.Tensor | None = None  # server state (``scoring: server``)

    def server_setup(self, uploads, ctx):
        if self.scoring != "server":
            return {}
        public_x = ctx.info.public_x
        n = len(public_x)
        g = torch.Generator().manual_seed(ctx.info.seed)
        idx = torch.randperm(n, generator=g)[: min(self.server_labelled_size, n)].to(public_x.device)
        self.labelled_y = ctx.public_y.to(public_x.device)[idx]  # public labels: server mode only
        return {"lkd_labelled_inputs": public_x[idx]}  # broadcast once

    def client_upload(self, ctx):
        device = ctx.public_logits.device
        if self.scoring == "server":
            x = ctx.received["lkd_labelled_inputs"].to(device)
            return {"lkd_logits": ctx.client.predict_logits(x).float()}
        c = ctx.public_logits.shape[-1]
        cal = ctx.data.calibration
        probs = ctx.client.predict_logits(cal.x.to(device)).float().softmax(-1)
        return {"class_auc": self.client_auc(probs, cal.y.to(device), ctx.client.classes, c)}

    def state_dict(self):
        return {"labelled_y": self.labelled_y}

    def load_state_dict(self, state):
        self.labelled_y = state["labelled_y"]

    @staticmethod
    def client_auc(probs: torch.Tensor, labels: torch.Tensor, classes: list[int], num_classes: int) -> torch.Tensor:
        """A client's C AUCs on its own calibration split: unseen classes 0, undefined local ones 1."""
        auc = one_vs_rest_auc(probs, labels, num_classes)
        local = torch.zeros(num_classes, dtype=torch.bool, device=probs.device)
        local[list(classes)] = True
        auc = torch.where(local & torch.isnan(auc), torch.ones_like(auc), auc)
        return torch.where(local, auc, torch.zeros_like(auc))

    def class_reliability(self, uploads, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """AUC (M x C) and beta = softmax over clients of T_w * AUC (M x C)."""
        if self.scoring == "server":
            logits = torch.stack([u["lkd_logits"].float() for u in uploads])  # M x L x C
            auc = one_vs_rest_auc(logits.softmax(-1), self.labelled_y.to(logits.device), c)
            auc = torch.nan_to_num(auc, nan=0.5)
        else:
            auc = torch.stack([u["class_auc"].float() for u in uploads])
        return auc, torch.softmax(self.temperature * auc, dim=0)

    def aggregate(self, uploads, ctx=None):
        z = self.stack_logits(uploads)
        q = z.softmax(-1)
        auc, beta = self.class_reliability(uploads, z.shape[-1])
        beta = beta.to(z.device)
        pred = q.argmax(-1)  # M x N
        w = torch.gather(beta, 1, pred)  # w_i(x) = beta[i, argmax Q_i(x)]
        weights = w / w.sum(0, keepdim=True).clamp_min(1e-30)
        return AggregationResult(teacher=self.mix(weights, q), weights=weights,
                                 stats={"lkd/auc_mean": float(auc.mean())})
