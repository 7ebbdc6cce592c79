"""Selective-FD: client-side density-ratio selectors and a server-side ambiguity selector (Shao et al. 2024)."""

from __future__ import annotations

from typing import Literal, Optional

import torch

from fdlit.aggregators.base import AggregationResult, Aggregator
from fdlit.aggregators.kulsif import KuLSIF
from fdlit.errors import ConfigError, check_at_least, check_number


class SelectiveFDAggregator(Aggregator):
    """Selective-FD (Shao, Wu, Zhang, *Selective Knowledge Sharing for Privacy-Preserving Federated
    Distillation without a Good Teacher*, Nat. Commun. 2024; Methods).

    Client side (``client_setup`` once, ``client_upload`` every round): client i estimates r_i(x) = p_i(x) / u(x) with KuLSIF
    (:class:`~fdlit.aggregators.kulsif.KuLSIF`, Gaussian kernel) and keeps public sample x iff
    r_i(x) > tau_client_i, where tau_client_i is the ``client_quantile`` (paper: 0.25) quantile of r_i
    on the client's calibration split (Selective-FD's "local validation set"). It uploads only the kept
    rows and a bit mask: soft labels = kept logits (N_i x C), hard labels = kept predicted classes (N_i
    small ints; the ``logits`` message is then empty).

    Server side (``aggregate``): the mean of the kept predictions of each sample,
        P(x) = sum_i m_i(x) Q_i(x) / sum_i m_i(x),   Q_i = softmax(z_i) (soft) or onehot(argmax z_i) (hard),
    drops samples no client kept, then drops ambiguous samples, ||P(x) - onehot(argmax P(x))||_1 =
    2 (1 - max P(x)) > tau_server. With hard labels the teacher sent back is onehot(argmax P) (the
    vote winner), with soft labels it is P. With every mask on and tau_server = 2 the soft rule is AVG.

    Choices where Selective-FD is silent or the setting differs (docs/algorithms.md **choice**):
      - feature space: raw inputs, flattened (Selective-FD uses raw pixels for MNIST);
      - one estimator per local class, a sample is kept if any of them keeps it (Selective-FD
        Supplementary, weak non-IID: "we construct two density-ratio estimators for these two
        classes"); with ``per_class: false`` one estimator on all local data;
      - u: ``auxiliary: uniform`` draws ``aux_samples`` points uniformly from the per-feature box
        spanned by the client's own and the public inputs (Selective-FD: uniform over the compact input
        space);
        ``auxiliary: public`` uses the public inputs instead (r then estimates p_i / p_pub);
      - kernel width sigma: median pairwise distance of the local samples (median heuristic);
        lambda = min(n, m)^-0.9 (a rate allowed by Selective-FD's Theorem 1); both overridable;
      - a class without calibration samples takes its threshold from its training samples;
      - the selectors depend only on inputs, which never change, so each client fits them once (first
        round) and reuses its mask; nothing about them is uploaded except the per-round mask;
      - tau_server default 1.0 (keep a sample when the ensemble's top probability >= 0.5);
        Selective-FD's ablation (Fig. 6) sweeps it and uses 2 (no server filtering) when varying
        tau_client;
      - hard labels travel as uint8 class ids (int16 for C > 256), up and down: the loop sends any
        one-hot teacher as class ids (``encode_teacher`` in the federation loop module).

    Args:
        labels: ``soft`` (kept logits) or ``hard`` (kept predicted classes).
        client_quantile: tau_client as a quantile in [0, 1) of r on the calibration split.
        server_threshold: tau_server in (0, 2]; 2 switches the server-side selector off.
        client_selector: false keeps every sample on every client (masks all on).
        per_class: one KuLSIF estimator per local class (true) or one for all local data.
        auxiliary: ``uniform`` or ``public`` (see above).
        aux_samples: n, number of auxiliary samples (>= 2).
        sigma: kernel width; null = median heuristic.
        lam: KuLSIF regulariser lambda > 0; null = min(n, m)^-0.9.
        ties: hard labels only: a sample whose vote is tied between classes is dropped (``drop``) or
            keeps the soft vote fractions as its target (``soft``); never given to the lowest class id.
    """

    short_name = "selfd"

    def __init__(
        self,
        labels: Literal["soft", "hard"] = "soft",
        client_quantile: float = 0.25,
        server_threshold: float = 1.0,
        client_selector: bool = True,
        per_class: bool = True,
        auxiliary: Literal["uniform", "public"] = "uniform",
        aux_samples: int = 1000,
        sigma: Optional[float] = None,
        lam: Optional[float] = None,
        ties: Literal["drop", "soft"] = "drop",
    ):
        if labels not in ("soft", "hard"):
            raise ConfigError("aggregator.labels", f"allowed: 'soft', 'hard'; got {labels!r}")
        if not 0 <= client_quantile < 1:
            raise ConfigError("aggregator.client_quantile", f"must be in [0, 1), got {client_quantile}")
        if not 0 < server_threshold <= 2:
            raise ConfigError("aggregator.server_threshold", f"must be in (0, 2], got {server_threshold}")
        if ties not in ("drop", "soft"):
            raise ConfigError("aggregator.ties", f"allowed: 'drop', 'soft'; got {ties!r}")
        if auxiliary not in ("uniform", "public"):
            raise ConfigError("aggregator.auxiliary", f"allowed: 'uniform', 'public'; got {auxiliary!r}")
        check_at_least("aggregator.aux_samples", aux_samples, 2)
        if sigma is not None:
            check_number("aggregator.sigma", sigma)
        if lam is not None:
            check_number("aggregator.lam", lam)
        self.labels = labels
        self.client_quantile = client_quantile
        self.server_threshold = server_threshold
        self.client_selector = client_selector
        self.per_class = per_class
        self.auxiliary = auxiliary
        self.aux_samples = aux_samples
        self.sigma = sigma
        self.lam = lam
        self.ties = ties

    # ------------------------------------------------------------------ client side
    def client_mask(self, train_x, train_y, cal_x, cal_y, classes, public_x, seed: int = 0) -> torch.Tensor:
        """Mask over the public samples for one client: OR over its (per-class) KuLSIF selectors."""
        public = public_x.flatten(1).double()
        local_all = train_x.flatten(1).double().to(public.device)
        if self.auxiliary == "public":
            aux = public[: self.aux_samples]
        else:
            both = torch.cat([local_all, public])
            lo, hi = both.min(0).values, both.max(0).values
            g = torch.Generator().manual_seed(seed)
            aux = lo + (hi - lo) * torch.rand(self.aux_samples, public.shape[1], generator=g, dtype=torch.float64).to(public.device)
        groups = [[c] for c in classes] if self.per_class else [list(classes)]
        mask = torch.zeros(len(public), dtype=torch.bool, device=public.device)
        for group in groups:
            g_tr = torch.isin(train_y.to(public.device), torch.tensor(group, device=public.device))
            if int(g_tr.sum()) < 2:
                continue  # no density to estimate from fewer than 2 samples
            est = KuLSIF.fit(local_all[g_tr], aux, self.sigma, self.lam)
            g_cal = torch.isin(cal_y.to(public.device), torch.tensor(group, device=public.device))
            ref = cal_x.flatten(1).to(public.device)[g_cal] if int(g_cal.sum()) else local_all[g_tr]
            threshold = torch.quantile(est(ref), self.client_quantile)
            mask |= est(public) > threshold
        return mask

    def client_setup(self, ctx):
        """Fit the selectors once (inputs never change) and keep the mask in the client's state."""
        device = ctx.info.public_x.device
        if not self.client_selector:
            mask = torch.ones(len(ctx.info.public_x), dtype=torch.bool, device=device)
        else:
            data = ctx.data
            mask = self.client_mask(
                data.train.x.to(device), data.train.y, data.calibration.x.to(device), data.calibration.y,
                ctx.client.classes, ctx.info.public_x, seed=ctx.info.client_seed(ctx.client.client_id),
            )
        ctx.state["selective_mask"] = mask
        return {}

    def client_upload(self, ctx):
        public_logits = ctx.public_logits
        mask = ctx.state["selective_mask"].to(public_logits.device)
        if ctx.info.public_index is not None:  # the mask covers the full public set; this round uses some rows
            mask = mask[ctx.info.public_index.to(mask.device)]
        kept = public_logits[mask]
        if self.labels == "soft":
            return {"logits": kept, "mask": mask}
        c = public_logits.shape[-1]
        label_dtype = torch.uint8 if c <= 256 else torch.int16
        # hard labels: only class ids go up; the (empty) logits message costs nothing
        return {"logits": kept[:0], "labels": kept.argmax(-1).to(label_dtype), "mask": mask}

    # ------------------------------------------------------------------ server side
    def aggregate(self, uploads, ctx=None):
        masks = torch.stack([u["mask"].bool() for u in uploads])  # M x N
        m, n = masks.shape
        device = masks.device
        if self.labels == "soft":
            c = uploads[0]["logits"].shape[-1]
            rows = torch.cat([u["logits"].float() for u in uploads]).softmax(-1)
        else:
            c = uploads[0]["logits"].shape[-1]  # hard labels: an empty 0 x C logits message
            rows = torch.nn.functional.one_hot(torch.cat([u["labels"].long() for u in uploads]), c).float()
        q = torch.zeros(m, n, c, device=device)
        q[masks] = rows.to(device)  # row-major order of masks = order of the concatenated kept rows
        counts = masks.sum(0)
        weights = torch.where(counts > 0, masks.float() / counts.clamp_min(1), torch.full((m, n), 1.0 / m, device=device))
        ensemble = self.mix(weights * masks, q)  # rows of dropped samples stay 0 and are replaced below
        top = ensemble.max(-1)
        ambiguity = 2.0 * (1.0 - top.values)  # ||P - onehot(argmax P)||_1 for a probability vector
        keep = (counts > 0) & (ambiguity <= self.server_threshold + 1e-6)
        # a hard-label vote whose top count is shared has no winner: argmax would hand it to the
        # lowest class id, so the sample is dropped (or keeps the soft vote, ``ties: soft``)
        tied = (ensemble >= top.values[:, None] - 1e-6).sum(-1) > 1
        if self.labels == "soft":
            teacher = ensemble
        else:
            teacher = torch.nn.functional.one_hot(top.indices, c).float()
            if self.ties == "soft":
                teacher = torch.where(tied[:, None], ensemble, teacher)
            else:
                keep = keep & ~tied
        teacher = torch.where(keep[:, None], teacher, torch.full_like(teacher, 1.0 / c))
        stats = {
            "selective/client_kept_fraction": float(masks.float().mean()),
            "selective/uncovered_fraction": float((counts == 0).float().mean()),
            "selective/ambiguous_fraction": float(((counts > 0) & ~keep).float().mean()),
            "selective/tied_fraction": float(((counts > 0) & tied).float().mean()) if self.labels == "hard" else 0.0,
        }
        return AggregationResult(teacher=teacher, weights=weights, keep=keep, stats=stats)
