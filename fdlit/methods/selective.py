"""Selective-FD: client-side density-ratio selectors and a server-side ambiguity selector (Shao et al. 2024)."""

from __future__ import annotations

import os
from typing import Literal

import torch

from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart
from fdlit.methods.kulsif import KuLSIF, kernel_dtype, squared_distances


class SelectiveFD(Aggregator):
    """Selective-FD (Shao, Wu, Zhang, *Selective Knowledge Sharing for Privacy-Preserving Federated
    Distillation without a Good Teacher*, Nat. Commun. 2024; Methods).

    Client side (``client_setup`` once, ``client_upload`` every round): client i estimates r_i(x) = p_i(x) / u(x) with KuLSIF
    (:class:`~fdlit.methods.kulsif.KuLSIF`, Gaussian kernel) and keeps public sample x iff
    r_i(x) > tau_client_i, where tau_client_i is the ``client_quantile`` (paper: 0.25) quantile of r_i
    on the client's calibration split (Selective-FD's "local validation set"). It uploads only the kept
    rows and a bit mask: soft labels = kept logits (N_i x C), hard labels = kept predicted classes (N_i
    small ints; the ``logits`` message is then empty).

    Server side (``aggregate``): the mean of the kept predictions of each sample,
        P(x) = sum_i m_i(x) Q_i(x) / sum_i m_i(x),   Q_i = softmax(z_i) (soft) or onehot(argmax z_i) (hard),
    drops samples no client kept, then drops ambiguous samples, ||P(x) - onehot(argmax P(x))||_1 =
    2 (1 - max P(x)) > tau_server. With hard labels the teacher sent back is onehot(argmax P) (the
    vote winner), with soft labels it is P. With every mask on and tau_server = 2 the soft rule is AVG.

    Feature space of the selectors (``features``): Selective-FD estimates densities on raw pixels for
    MNIST and on the features of a pretrained backbone for CIFAR-10:
      - ``inputs``: raw inputs, flattened; fitted once (inputs never change);
      - ``penultimate``: the client's own penultimate-layer features (the input of its network's
        last linear layer); they change as the client trains, so the selectors are refitted every
        round on the current features;
      - ``backbone``: a frozen pretrained image backbone named by ``backbone`` (a Hugging Face hub id
        or a local folder, loaded with ``transformers.AutoModel``; its pooled output, or the mean of
        its last hidden states, is the feature); fitted once. fdlit never downloads it: a hub id
        must already be in the Hugging Face cache, else construction fails naming what to fetch.

    Per-round public sampling (``public_per_round``): Selective-FD distils on a fresh random batch of
    the public set every round. With ``public_per_round: n`` every client and the server use the same
    n public samples in round r, drawn from (seed, r) (the server announcing the draw is a seed, not
    counted); selected samples outside it are not uploaded. null uses the whole public set every round.

    Joint loss (``private_weight`` = alpha; Selective-FD, Theorem 2 and its ablation on alpha): the public
    phase minimises alpha L_private + (1 - alpha) L_proxy, with L_private the mean CE on the client's
    m_k private samples and L_proxy the mean CE against the teacher on the m_proxy kept public samples.
    fdlit trains on the union, scaling each private target by alpha (m_k + m_proxy) / m_k and each proxy
    target by (1 - alpha) (m_k + m_proxy) / m_proxy (the paper's own empirical form of the loss), so
    the mean of a shuffled batch is an unbiased estimate of it on every executor. The private phase
    before it is unchanged.

    Choices where Selective-FD is silent or the setting differs (docs/algorithms.md **choice**):
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
        features: the selectors' feature space: ``inputs``, ``penultimate`` or ``backbone`` (see above).
        backbone: with ``features: backbone``, the frozen pretrained backbone: a Hugging Face hub id
            (already in the local cache) or a local folder saved with ``save_pretrained``.
        public_per_round: n public samples per round (see above); null: all of them.
        private_weight: alpha of the joint loss (see above) in [0, 1); null: the public phase
            distils on the kept public samples only (Algorithm 1, lines 6-7).
    """

    short_name = "selfd"
    label = "Selective-FD"  # how tables and figures name the method
    secure_refusal = "selects per public sample which clients' predictions enter the teacher, which needs each one"
    released = {"logits": "rows", "labels": "unbounded", "mask": "unbounded"}

    def __init__(
        self,
        labels: Literal["soft", "hard"] = "soft",
        client_quantile: float = 0.25,
        server_threshold: float = 1.0,
        client_selector: bool = True,
        per_class: bool = True,
        auxiliary: Literal["uniform", "public"] = "uniform",
        aux_samples: int = 1000,
        sigma: float | None = None,
        lam: float | None = None,
        ties: Literal["drop", "soft"] = "drop",
        features: Literal["inputs", "penultimate", "backbone"] = "inputs",
        backbone: str | None = None,
        public_per_round: int | None = None,
        private_weight: float | None = None,
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
        if features not in ("inputs", "penultimate", "backbone"):
            raise ConfigError("aggregator.features", f"allowed: 'inputs', 'penultimate', 'backbone'; got {features!r}")
        if (features == "backbone") != (backbone is not None):
            raise ConfigError("aggregator.backbone", "a hub id or local folder with features: backbone, and null "
                              f"otherwise; got features={features!r}, backbone={backbone!r}")
        if backbone is not None:
            check_backbone_available(backbone)
        if public_per_round is not None:
            check_at_least("aggregator.public_per_round", public_per_round, 1)
        if private_weight is not None and not 0 <= private_weight < 1:
            raise ConfigError("aggregator.private_weight", f"null or a number in [0, 1), got {private_weight!r}")
        self.features, self.backbone, self.public_per_round = features, backbone, public_per_round
        self.private_weight = private_weight
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

    def client_part(self) -> SelectiveFDClient:
        return SelectiveFDClient(
            labels=self.labels, client_quantile=self.client_quantile, client_selector=self.client_selector,
            per_class=self.per_class, auxiliary=self.auxiliary, aux_samples=self.aux_samples, sigma=self.sigma,
            lam=self.lam, features=self.features, backbone=self.backbone, public_per_round=self.public_per_round,
            private_weight=self.private_weight)

    # ------------------------------------------------------------------ server side
    def aggregate(self, uploads, ctx):
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


class SelectiveFDClient(ClientPart):
    """Selective-FD's client part: the KuLSIF selectors and their mask over the public set, the
    kept rows (soft) or their labels (hard) as the upload, and the joint loss's training set.
    Its arguments are :class:`SelectiveFD`'s of the same names."""

    def __init__(self, labels: str, client_quantile: float, client_selector: bool, per_class: bool, auxiliary: str,
                 aux_samples: int, sigma: float | None, lam: float | None, features: str,
                 backbone: str | None, public_per_round: int | None, private_weight: float | None):
        self.labels, self.client_quantile, self.client_selector = labels, client_quantile, client_selector
        self.per_class, self.auxiliary, self.aux_samples, self.sigma, self.lam = per_class, auxiliary, aux_samples, sigma, lam
        self.features, self.backbone, self.public_per_round = features, backbone, public_per_round
        self.private_weight = private_weight
        self._backbone_model = None

    def client_mask(self, train_x, train_y, cal_x, cal_y, classes, public_x, seed: int = 0,
                    rows: torch.Tensor | None = None) -> torch.Tensor:
        """Mask over the public samples for one client: OR over its (per-class) KuLSIF selectors.
        The x arguments are points of the selectors' feature space (inputs or features). ``rows``
        (bool over ``public_x``): the selectors are evaluated on these rows only, the rest of the mask
        is off; every public row still spans the auxiliary box."""
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
        if rows is not None:
            rows = rows.to(public.device)
            public = public[rows]
        kept = torch.zeros(len(public), dtype=torch.bool, device=public.device)
        # the per-class selectors share the auxiliary set: its distances are computed once
        aux_aux = public_aux = None
        dtype = kernel_dtype(self.lam, len(aux))
        for group in groups:
            g_tr = torch.isin(train_y.to(public.device), torch.tensor(group, device=public.device))
            if int(g_tr.sum()) < 2:
                continue  # no density to estimate from fewer than 2 samples
            if aux_aux is None:
                aux_aux, public_aux = squared_distances(aux, aux, dtype), squared_distances(public, aux, dtype)
            est = KuLSIF.fit(local_all[g_tr], aux, self.sigma, self.lam, aux_sq_dists=aux_aux, dtype=dtype)
            g_cal = torch.isin(cal_y.to(public.device), torch.tensor(group, device=public.device))
            ref = cal_x.flatten(1).to(public.device)[g_cal] if int(g_cal.sum()) else local_all[g_tr]
            threshold = torch.quantile(est(ref), self.client_quantile)
            kept |= est(public, aux_sq_dists=public_aux) > threshold
        if rows is None:
            return kept
        mask[rows] = kept
        return mask

    def embed(self, ctx, x: torch.Tensor) -> torch.Tensor:
        """Points of the selectors' feature space for inputs x."""
        if self.features == "penultimate":
            return penultimate_features(ctx.client, x)
        if self.features == "backbone":
            return self.backbone_features(x)
        return x

    def fit_mask(self, ctx, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The client's mask over ``ctx.info.public_x`` (``rows``: see :meth:`client_mask`)."""
        device = ctx.info.public_x.device
        if not self.client_selector:
            return torch.ones(len(ctx.info.public_x), dtype=torch.bool, device=device)
        data = ctx.data
        return self.client_mask(
            self.embed(ctx, data.train.x.to(device)), data.train.y, self.embed(ctx, data.calibration.x.to(device)),
            data.calibration.y, ctx.client.classes, self.embed(ctx, ctx.info.public_x),
            seed=ctx.info.client_seed(ctx.client.client_id), rows=rows,
        )

    def setup(self, ctx):
        """Fit the selectors once when their features never change (inputs, a frozen backbone) and
        keep the mask in the client's state; penultimate features are refitted every round."""
        if self.features != "penultimate":
            ctx.state["selective_mask"] = self.fit_mask(ctx)
        return {}

    def round_sample(self, info) -> torch.Tensor | None:
        """The public samples of this round (bool mask over the public set), the same on every
        client and the server; None when every round uses the whole public set."""
        n = len(info.public_x)
        if self.public_per_round is None or self.public_per_round >= n:
            return None
        g = torch.Generator().manual_seed(int(info.seed) * 1_000_003 + int(info.round) * 7919 + 0x5E1)
        out = torch.zeros(n, dtype=torch.bool)
        out[torch.randperm(n, generator=g)[: self.public_per_round]] = True
        return out.to(info.public_x.device)

    def upload(self, ctx):
        public_logits = ctx.public_logits
        sample = self.round_sample(ctx.info)
        if self.features == "penultimate":
            # refitted on this round's public rows (``info.public_x``), evaluated on the sampled ones only
            mask = self.fit_mask(ctx, rows=sample).to(public_logits.device)
        else:
            mask = ctx.state["selective_mask"].to(public_logits.device)
            if ctx.info.public_index is not None:  # the set-up's mask covers the full public set
                mask = mask[ctx.info.public_index.to(mask.device)]
        if sample is not None:
            mask = mask & sample.to(mask.device)
        kept = public_logits[mask]
        if self.labels == "soft":
            return {"logits": kept, "mask": mask}
        c = public_logits.shape[-1]
        label_dtype = torch.uint8 if c <= 256 else torch.int16
        # hard labels: only class ids go up; the (empty) logits message costs nothing
        return {"logits": kept[:0], "labels": kept.argmax(-1).to(label_dtype), "mask": mask}

    def distillation_set(self, ctx):
        """The joint loss's training set: private samples and kept public samples with scaled targets."""
        public_x, targets, private_x, private_y = ctx.public_x, ctx.targets, ctx.private_x, ctx.private_y
        if self.private_weight is None or not len(private_x):
            return public_x, targets
        a, m_k, m_p = self.private_weight, len(private_x), len(public_x)
        total = m_k + m_p
        # CE is linear in a soft target, so a scaled target is a per-sample weight on its loss term
        onehot = torch.nn.functional.one_hot(private_y.long().to(targets.device), targets.shape[-1]).float()
        x = torch.cat([private_x.to(public_x.device).to(public_x.dtype), public_x])
        t = torch.cat([onehot * (a * total / m_k), targets.float() * ((1 - a) * total / m_p)])
        return x, t

    # ------------------------------------------------------------------ a frozen pretrained backbone
    def backbone_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features of the frozen backbone (loaded once, kept on this process)."""
        if self._backbone_model is None:
            from transformers import AutoModel

            self._backbone_model = AutoModel.from_pretrained(self.backbone, local_files_only=True).eval()
        model = self._backbone_model.to(x.device)
        cfg = model.config
        x = x.float() / 255.0 if not x.is_floating_point() else x.float()
        size = getattr(cfg, "image_size", None)
        if size and x.dim() == 4 and tuple(x.shape[-2:]) != (size, size):
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        channels = getattr(cfg, "num_channels", None)
        if channels and x.dim() == 4 and x.shape[1] != channels:
            x = x.mean(1, keepdim=True).expand(-1, channels, -1, -1)  # grey <-> colour
        out = []
        with torch.no_grad():
            for i in range(0, len(x), 256):
                o = model(pixel_values=x[i: i + 256])
                pooled = getattr(o, "pooler_output", None)
                out.append((pooled if pooled is not None else o.last_hidden_state.mean(1)).flatten(1))
        return torch.cat(out).double()


def penultimate_features(client, x: torch.Tensor) -> torch.Tensor:
    """The input of the client network's last linear layer, for inputs x (batched as prediction)."""
    last = [m for m in client.model.modules() if isinstance(m, torch.nn.Linear)]
    if not last:
        raise ConfigError("aggregator.features", f"penultimate needs a network whose last layer is linear; "
                          f"{type(client.model).__name__} has no torch.nn.Linear")
    seen: list[torch.Tensor] = []
    handle = last[-1].register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().flatten(1)))
    try:
        client.predict_logits(x)
    finally:
        handle.remove()
    return torch.cat(seen).double()


def check_backbone_available(backbone: str) -> None:
    """A backbone must be on this machine: a local folder, or a hub id in the Hugging Face cache."""
    if os.path.isdir(backbone):
        return
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(backbone, local_files_only=True)
    except Exception as exc:  # not cached (LocalEntryNotFoundError), a bad id, or no huggingface_hub
        raise ConfigError(
            "aggregator.backbone",
            f"the weights of {backbone!r} are not on this machine and fdlit does not download them "
            f"({type(exc).__name__}); fetch them where there is internet access, e.g. "
            f"`huggingface-cli download {backbone}`, and copy the Hugging Face cache (HF_HOME) here, "
            "or give a local folder saved with save_pretrained",
        ) from None
