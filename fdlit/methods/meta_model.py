"""Meta-Model aggregator, MM (Kovalchuk et al. 2025 (workshop), Sec. 3.1.2)."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.adam import adam

from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart


class MetaModelClient(ClientPart):
    """MM's client part: its share of the labelled set at set-up, its logits on the pooled set every round."""

    def __init__(self, labelled_per_client: int | None, labelled_size: int | None):
        self.labelled_per_client, self.labelled_size = labelled_per_client, labelled_size

    def setup(self, ctx):
        """Client side, once: pick samples of the calibration split; send them with their labels."""
        cal = ctx.data.calibration
        g = torch.Generator().manual_seed(ctx.info.client_seed(ctx.client.client_id))
        share = self.client_share(ctx.client.client_id, ctx.info.num_clients)
        take = torch.randperm(len(cal.x), generator=g)[:share]
        label_dtype = torch.uint8 if ctx.info.num_classes <= 256 else torch.int16
        return {"mm_inputs": cal.x[take], "mm_labels": cal.y[take].to(label_dtype)}

    def client_share(self, client_id: int, num_clients: int) -> int:
        """How many labelled samples client ``client_id`` contributes (before its calibration size caps it)."""
        if self.labelled_size is None:
            return self.labelled_per_client
        base, extra = divmod(self.labelled_size, num_clients)
        return base + (1 if client_id < extra else 0)

    def upload(self, ctx):
        x = ctx.received["mm_inputs"].to(ctx.public_logits.device)
        return {"mm_logits": ctx.client.predict_logits(x).float()}


class MetaModel(Aggregator):
    """MM (Kovalchuk et al., workshop version of *Who to Trust?*; Sec. 3.1.2, Eq. 3-4):

        h(x) = [z_1(x), ..., z_M(x)] in R^{M*C},   P(x) = softmax( A(h(x)) )

    A is a small MLP trained with cross-entropy on a labelled set on which every client computed its
    logits. It learns *which client to trust where*; it must be retrained whenever the clients
    change, i.e. every round here (from scratch, seeded). No per-client weights W exist.

    The labelled set (**choice**; the workshop paper, App. A.2: "an additional set of 3,000 images is
    reserved specifically for training the auxiliary model in MM Aggregator", "constructed using images
    from private datasets"): in its client part's ``setup`` every client contributes samples of its *calibration*
    split (never trained on, so its own logits on them are not overfitted), sending inputs and labels
    to the server (round 0, counted); the server broadcasts the pooled inputs to every client (round
    0, counted down). Each round every client uploads its logits on the pooled set (L x C, counted as
    ``mm_logits``). NB: this shares private images with everyone, as the workshop
    paper does. Its size is set either per client (``labelled_per_client``, 15 when neither is given)
    or in total (``labelled_size``: L split as evenly as possible over the M clients, client i taking
    L // M, plus one for the first L mod M clients; 3,000 in the workshop paper's setting, i.e. 150
    per client at M = 20). A client whose calibration split is smaller than its share sends all of
    it, so the set can come out smaller than asked; its real size is logged as ``mm/labelled_size``.

    Other choices: A = Linear(M*C, hidden) - ReLU - Linear(hidden, C) (hidden = 0: linear);
    features standardised with the labelled set's mean and std; full-batch Adam for ``steps`` steps
    with weight decay; labelled samples a client contributes are drawn at random (seeded).

    Args:
        labelled_per_client: samples each client contributes (>= 1; default 15).
        labelled_size: total labelled-set size L, split over the clients (>= 1); give this or
            ``labelled_per_client``, not both.
        hidden: hidden units of A (0 = a linear model).
        steps: full-batch training steps per round (>= 1).
        lr: Adam learning rate (> 0).
        weight_decay: Adam L2 (>= 0).
    """

    short_name = "mm"
    label = "MM"  # how tables and figures name the method
    released = {"logits": "rows", "mm_logits": "unbounded"}

    def __init__(self, labelled_per_client: int | None = None, hidden: int = 64, steps: int = 300,
                 lr: float = 1e-2, weight_decay: float = 1e-3, labelled_size: int | None = None):
        if labelled_per_client is not None and labelled_size is not None:
            raise ConfigError("aggregator.labelled_size",
                              f"give the total (labelled_size) or the per-client count (labelled_per_client), "
                              f"not both; set the other to null (got {labelled_size} and {labelled_per_client})")
        if labelled_size is not None:
            check_at_least("aggregator.labelled_size", labelled_size, 1)
        elif labelled_per_client is None:
            labelled_per_client = 15
        if labelled_per_client is not None:
            check_at_least("aggregator.labelled_per_client", labelled_per_client, 1)
        check_at_least("aggregator.hidden", hidden, 0)
        check_at_least("aggregator.steps", steps, 1)
        check_number("aggregator.lr", lr)
        check_number("aggregator.weight_decay", weight_decay, inclusive=True)
        self.labelled_per_client = labelled_per_client
        self.labelled_size = labelled_size
        self.hidden, self.steps, self.lr, self.weight_decay = hidden, steps, lr, weight_decay
        self.labelled_y: torch.Tensor | None = None  # server state: labels of the pooled labelled set

    def client_part(self) -> ClientPart:
        return MetaModelClient(self.labelled_per_client, self.labelled_size)

    def server_setup(self, uploads, ctx):
        self.labelled_y = torch.cat([u["mm_labels"] for u in uploads]).long()
        return {"mm_inputs": torch.cat([u["mm_inputs"] for u in uploads])}  # broadcast to every client

    def state_dict(self):
        return {"labelled_y": self.labelled_y}

    def load_state_dict(self, state):
        self.labelled_y = state["labelled_y"]

    def set_labels(self, labels: torch.Tensor) -> None:
        """Labels of the pooled labelled set (for unit tests; ``server_setup`` sets them in a run)."""
        self.labelled_y = labels.long()

    def fit_meta_model(self, features: torch.Tensor, labels: torch.Tensor, num_classes: int,
                       seed: int = 0) -> nn.Module:
        with torch.random.fork_rng(devices=[]):  # seeded initialisation, global stream untouched
            torch.manual_seed(seed)
            d = features.shape[1]
            body = [nn.Linear(d, self.hidden), nn.ReLU(), nn.Linear(self.hidden, num_classes)] if self.hidden else [
                nn.Linear(d, num_classes)]
            net = nn.Sequential(*body).to(features.device)
        # torch.optim.Adam's own update (its functional form, single-tensor, as the class runs on CPU):
        # the same results bit for bit without the class's per-step bookkeeping (a quarter of a fit's
        # time at 300 small steps); the fused kernel would be faster but rounds differently
        params = list(net.parameters())
        exp_avgs = [torch.zeros_like(p) for p in params]
        exp_avg_sqs = [torch.zeros_like(p) for p in params]
        state_steps = [torch.tensor(0.0) for _ in params]
        with torch.enable_grad():
            for _ in range(self.steps):
                loss = nn.functional.cross_entropy(net(features), labels)
                grads = list(torch.autograd.grad(loss, params))
                with torch.no_grad():
                    adam(params, grads, exp_avgs, exp_avg_sqs, [], state_steps, foreach=False, capturable=False,
                         differentiable=False, fused=None, grad_scale=None, found_inf=None, has_complex=False,
                         amsgrad=False, beta1=0.9, beta2=0.999, lr=self.lr, weight_decay=self.weight_decay,
                         eps=1e-8, maximize=False)
        return net.eval()

    def aggregate(self, uploads, ctx):
        if self.labelled_y is None:
            raise RuntimeError("MetaModel has no labelled set: run its set-up or set_labels")
        z = self.stack_logits(uploads)  # M x N x C
        m, n, c = z.shape
        h_lab = torch.stack([u["mm_logits"].float() for u in uploads]).permute(1, 0, 2).reshape(-1, m * c)
        h_pub = z.permute(1, 0, 2).reshape(n, m * c)  # h(x) = concat_i z_i(x)
        mean, std = h_lab.mean(0), h_lab.std(0).clamp_min(1e-6)
        labels = self.labelled_y.to(z.device)
        # retrained from scratch every round, seeded by (run seed, round)
        seed = ctx.info.seed * 1_000_003 + ctx.info.round
        net = self.fit_meta_model((h_lab - mean) / std, labels, c, seed)
        with torch.no_grad():
            teacher = net((h_pub - mean) / std).softmax(-1)
            train_acc = float((net((h_lab - mean) / std).argmax(-1) == labels).float().mean())
        return AggregationResult(teacher=teacher, stats={"mm/labelled_acc": train_acc,
                                                         "mm/labelled_size": float(len(labels))})
