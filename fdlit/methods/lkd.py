"""LKD: label-driven class-reliability weighting (F2L, Nguyen et al. 2022, Sec. 3.2-3.3)."""

from __future__ import annotations

import math
from typing import Literal

import torch

from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart


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


def auc_against_unlabelled(positives: torch.Tensor, unlabelled: torch.Tensor) -> torch.Tensor:
    """P(s_pos > s_u) + P(s_pos = s_u) / 2 over all pairs of a positive and an unlabelled score (the
    Mann-Whitney AUC with the unlabelled set as the negatives), in O((P + U) log U) by sorting."""
    u = unlabelled.sort().values
    below = torch.searchsorted(u, positives, right=False)
    ties = torch.searchsorted(u, positives, right=True) - below
    return ((below + 0.5 * ties).double() / len(u)).mean()


SCORINGS = ("calibration_vs_public", "calibration", "server")


class LKDClient(ClientPart):
    """LKD's client part: this round's class AUCs (or, ``scoring: server``, its logits on the
    server's labelled inputs)."""

    def __init__(self, scoring: str):
        self.scoring = scoring

    def upload(self, ctx):
        device = ctx.public_logits.device
        if self.scoring == "server":
            x = ctx.received["lkd_labelled_inputs"].to(device)
            return {"lkd_logits": ctx.client.predict_logits(x).float()}
        c = ctx.public_logits.shape[-1]
        cal = ctx.data.calibration
        cal_logits = ctx.client.predict_logits(cal.x.to(device))
        if self.scoring == "calibration":
            probs = cal_logits.float().softmax(-1)
            return {"class_auc": LKD.client_auc(probs, cal.y.to(device), ctx.client.classes, c)}
        auc = LKD.client_auc_vs_public(cal_logits.double().log_softmax(-1), cal.y.to(device),
                                        ctx.public_logits.double().log_softmax(-1), ctx.client.classes, c)
        return {"class_auc": auc.float()}


class LKD(Aggregator):
    """LKD class reliability (Nguyen et al., F2L, *Label-driven Knowledge Aggregator*; Sec. 3.3,
    Eq. 7 and Algorithm 6):

        beta[i, c] = softmax_i( T_w * AUC_{i,c} ),   w_i(x) = beta[i, argmax_c Q_i(x)],
        W[i, x] = w_i(x) / sum_j w_j(x),             P(x) = sum_i W[i, x] Q_i(x)

    where AUC_{i,c} is the one-vs-rest ROC-AUC of client i's class-c output. A client is trusted on x
    according to how reliable it is on the class it predicts (F2L's teachers distil the samples they
    pseudo-label c with weight beta^c_r, Eq. 3). F2L introduces the temperature T_w ("a large
    temperatured value" favours the better teacher, Sec. 3.3) but prints no value for it: fdlit's
    default T_w = 20 is a **choice**.

    F2L scores AUCs on a labelled validation set on the server that holds every class (its data pool
    S). In FD no labelled set of every class exists; ``scoring`` (**choice**, docs/algorithms.md):

      - ``calibration_vs_public`` (default; no labels leave the clients): client i scores class c in
        C_i with the AUC of its class-c score between its own calibration samples of class c
        (positives) and the unlabelled public set (the "rest": the public set holds every class, as
        F2L's S does). This is the positive-vs-unlabelled AUC: if the public samples of class c (a
        fraction pi_c of the public set) score like the calibration ones, it equals
        pi_c / 2 + (1 - pi_c) * AUC_{i,c}, the F2L AUC against true negatives mapped by one increasing
        affine map that is the same for every client (pi_c is a property of the shared public set), so
        it ranks the holders of c as F2L's AUC would; T_w acts as T_w * (1 - pi_c). A client whose
        class-c output fires on public samples of classes it never saw (it maps them onto c) scores
        lower on c. Classes a client never saw get AUC 0 (the lowest reliability); a local class
        without calibration samples gets 0.5 (no evidence). Scores are the log-probabilities in
        float64 (the ranking of the probabilities, without float32's ties at 1.0).
      - ``calibration``: each client scores itself on its own calibration split only (negatives: its
        other local classes). Unseen classes get AUC 0; a local class whose AUC is undefined (k = 1)
        gets 1. Kept for comparison: with k classes per client the holders of c all score ~1 on
        their own data, so beta ~ uniform over the holders of c, w_i(x) ~ 1 / (number of holders of
        the class i predicts); when every class has as many holders (digits, M = 20, k = 2) this
        is AVG's weights exactly (``tests/test_digits_fidelity.py``).
      - ``server``: as in F2L, the server holds a labelled set: ``server_labelled_size`` samples of
        the public set *with their labels* (this mode uses public labels for training the
        aggregator; say so when reporting it). Their inputs are broadcast once (round 0, counted);
        every round each client uploads its logits on them (L x C, counted) and the server computes
        the AUCs. A class absent from the labelled set gets AUC 0.5 for everyone.

    In every scoring, beta is normalised over clients per class, so w_i(x) depends only on how client
    i ranks among the holders of the class it predicts: LKD can favour the holders of x's true class
    only through differences between holders (e.g. a client that maps many foreign samples onto c
    has a lower AUC on c), never through the level of a class's reliability.

    Upload: C AUCs per client and round (``calibration_vs_public``, ``calibration``) or its logits
    on the labelled set (``server``). AUCs are computed in torch (:func:`one_vs_rest_auc`,
    :func:`auc_against_unlabelled`), batched over clients in ``server`` mode.

    Args:
        temperature: T_w > 0 (fdlit's default 20; F2L gives no value).
        scoring: ``calibration_vs_public``, ``calibration`` or ``server``.
        server_labelled_size: L, for ``scoring: server`` (>= 2).
    """

    short_name = "lkd"
    label = "LKD"  # how tables and figures name the method
    released = {"logits": "rows", "lkd_logits": "unbounded", "class_auc": "unbounded"}

    def __init__(self, temperature: float = 20.0,
                 scoring: Literal["calibration_vs_public", "calibration", "server"] = "calibration_vs_public",
                 server_labelled_size: int = 100):
        check_number("aggregator.temperature", temperature)
        if scoring not in SCORINGS:
            raise ConfigError("aggregator.scoring",
                              f"allowed: {', '.join(repr(s) for s in SCORINGS)}; got {scoring!r}")
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

    def client_part(self) -> ClientPart:
        return LKDClient(self.scoring)

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

    @staticmethod
    def client_auc_vs_public(cal_scores: torch.Tensor, labels: torch.Tensor, public_scores: torch.Tensor,
                             classes: list[int], num_classes: int) -> torch.Tensor:
        """A client's C AUCs, class c's calibration samples against the unlabelled public set
        (``scoring: calibration_vs_public``): unseen classes 0, a local class without calibration
        samples 0.5."""
        auc = torch.zeros(num_classes, dtype=torch.float64, device=cal_scores.device)
        for c in classes:
            pos = cal_scores[labels == c, c]
            auc[c] = auc_against_unlabelled(pos, public_scores[:, c]) if len(pos) else 0.5
        return auc

    def class_reliability(self, uploads, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """AUC (M x C) and beta = softmax over clients of T_w * AUC (M x C)."""
        if self.scoring == "server":
            logits = torch.stack([u["lkd_logits"].float() for u in uploads])  # M x L x C
            auc = one_vs_rest_auc(logits.softmax(-1), self.labelled_y.to(logits.device), c)
            auc = torch.nan_to_num(auc, nan=0.5)
        else:
            auc = torch.stack([u["class_auc"].float() for u in uploads])
        return auc, torch.softmax(self.temperature * auc, dim=0)

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        q = z.softmax(-1)
        auc, beta = self.class_reliability(uploads, z.shape[-1])
        beta = beta.to(z.device)
        pred = q.argmax(-1)  # M x N
        w = torch.gather(beta, 1, pred)  # w_i(x) = beta[i, argmax Q_i(x)]
        weights = w / w.sum(0, keepdim=True).clamp_min(1e-30)
        return AggregationResult(teacher=self.mix(weights, q), weights=weights,
                                 stats={"lkd/auc_mean": float(auc.mean())})
