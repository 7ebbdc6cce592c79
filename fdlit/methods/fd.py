"""FD: federated distillation with per-class average logits, no public set (Jeong et al. 2018).

Jeong, Oh, Kim, Bennis, Kim, *Communication-efficient on-device machine learning: federated
distillation and augmentation under non-IID private data*, NeurIPS Workshop on Machine Learning on
the Phone and other Consumer Devices 2018 (arXiv 1811.11479), "Federated distillation". After its
private phase client i sends, for every class c it holds (n_ic > 0 training samples), its average
logit vector over those samples

    F_i[c] = (1 / n_ic) sum_{(x, y) in D_i, y = c} z_i(x)                  (C x C, plus a class mask),

the server averages per class over the clients that hold it,

    G[c] = (1 / |H_c|) sum_{i in H_c} F_i[c],    H_c = {i : n_ic > 0},

and sends G and the mask of classes some client holds back to every client. From then on (round 2
on) each private step's loss gains a distillation term against the global logits of each sample's
label (Hinton et al.'s KD at temperature T, weight gamma):

    L = CE(z(x), y) + gamma * T^2 * KL( softmax(G[y] / T) || softmax(z(x) / T) ),

over the samples whose label some client holds. Predictions, and so a client's accuracies, stay
each client's own network's (G is not a model and is not evaluated): the exchange is a regulariser, so clients may run different architectures (``fdlit.models.PerClient``).

Messages per client and round: ``class_logits`` (C x C float32) and ``class_mask`` (C bits) up,
``global_class_logits`` (C x C float32) and ``class_mask`` down. No set-up, no public set
(``data.public_size: 0`` is allowed), no server state.

Choices (the paper leaves them open): F_i is measured after the private phase with the trained
network in eval mode on the client's training split (the paper accumulates it during training);
the server's mean is unweighted over holders, as in the paper; the client's own F_i stays in G
(the paper's variant that leaves it out needs a message per client); with participation, classes
held by no arrived client are masked out of the term. DP on these uploads is refused: the parameter
exchange flow does not clip or noise them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fdlit.errors import ConfigError, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientContext, ClientPart, ServerContext, Uploads


def model_device(module: torch.nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def class_means(values: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class means of ``values`` (N x D) over ``labels`` (N): (C x D means, zero for absent
    classes; C counts)."""
    labels = labels.long()
    counts = torch.bincount(labels, minlength=num_classes)[:num_classes]
    sums = torch.zeros(num_classes, values.shape[-1], dtype=values.dtype, device=values.device)
    sums.index_add_(0, labels, values)
    return sums / counts.clamp_min(1).to(values.dtype)[:, None], counts


def holders_average(values: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_i w_ic v_i[c] / sum_i w_ic over the clients with w_ic > 0 (``values``: M x C x D,
    ``weights``: M x C); (C x D averages, zero where no client holds c; C bool mask of held classes)."""
    w = weights.to(values.dtype)
    total = w.sum(0)
    held = total > 0
    avg = (w[:, :, None] * values).sum(0) / total.clamp_min(torch.finfo(values.dtype).tiny)[:, None]
    return torch.where(held[:, None], avg, torch.zeros_like(avg)), held


def stack_uploads(uploads: Uploads, key: str, method: str, hint: str = "") -> torch.Tensor:
    """The uploads' ``key`` arrays stacked; clients whose arrays differ in shape are refused."""
    shapes = {tuple(u[key].shape) for u in uploads}
    if len(shapes) > 1:
        raise ConfigError("model", f"{method} averages the clients' {key} per class, so every client's must have "
                          f"the same shape; got {sorted(shapes)}{hint}")
    return torch.stack([u[key].float() for u in uploads])


class FDClient(ClientPart):
    """FD's client part: per-class average logits up; the KD term against the global ones."""

    loss_state_keys = ("fd_teacher", "fd_known")

    def __init__(self, gamma: float, temperature: float):
        self.gamma, self.temperature = gamma, temperature

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        train = ctx.data.train
        device = model_device(ctx.client)
        logits = ctx.client.predict_logits(train.x.to(device))
        means, counts = class_means(logits.float(), train.y.to(device), ctx.info.num_classes)
        return {"class_logits": means, "class_mask": counts > 0}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        if "global_class_logits" not in ctx.received:
            return {}
        device = model_device(ctx.client)
        ctx.state["fd_teacher"] = ctx.received["global_class_logits"].float().to(device)
        ctx.state["fd_known"] = ctx.received["class_mask"].float().to(device)
        return {}

    def loss(self, ctx):
        if ctx.phase != "private" or "fd_teacher" not in ctx.state:
            return ctx.base
        t = self.temperature
        teacher = ctx.state["fd_teacher"][ctx.target].to(ctx.logits.dtype)  # G[y], B x C
        known = ctx.state["fd_known"][ctx.target].to(ctx.logits.dtype)
        p = F.softmax(teacher / t, -1)
        kl = (p * (F.log_softmax(teacher / t, -1) - F.log_softmax(ctx.logits / t, -1))).sum(-1)
        return ctx.base + self.gamma * t * t * (known * kl).mean()


class FedDistill(Aggregator):
    """FD (Jeong et al. 2018): G[c] = mean over holders of F_i[c]; loss CE + gamma T^2 KL(G[y] || z)
    (module docstring).

    Args:
        gamma: weight of the distillation term (>= 0; 0 is local training).
        temperature: KD temperature T (> 0).
    """

    short_name = "fd"
    label = "FD"
    exchange = "parameters"  # the parameter-exchange flow: uploads after the private phase, no public phase
    needs_public_set = False
    released = {"class_logits": "unbounded", "class_mask": "clear"}

    def __init__(self, gamma: float = 1.0, temperature: float = 1.0):
        self.gamma = check_number("aggregator.gamma", gamma, minimum=0.0, inclusive=True)
        self.temperature = check_number("aggregator.temperature", temperature)

    def client_part(self) -> ClientPart:
        return FDClient(self.gamma, self.temperature)

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        logits = stack_uploads(uploads, "class_logits", "FD")
        masks = torch.stack([u["class_mask"].to(logits.device) for u in uploads])
        teacher, held = holders_average(logits, masks)
        return AggregationResult(teacher=None, broadcast={"global_class_logits": teacher, "class_mask": held},
                                 stats={"fd/held_classes": float(held.sum())})

    def state_dict(self) -> dict[str, Any]:
        return {}
