"""FedTGP: trainable global prototypes learned on the server with an adaptive-margin contrastive loss
(Zhang et al. 2024).

Zhang, Liu, Hua, Cao, *FedTGP: Trainable Global Prototypes with Adaptive-Margin-Enhanced Contrastive
Learning for Data and Model Heterogeneity in Federated Learning*, AAAI 2024. Clients run FedProto's
side (:mod:`fdlit.methods.fedproto`): after its private phase client i sends, for every class c it
holds, its prototype C_i[c] (the mean penultimate features ``embed(x)`` over its samples of c) and its
count. The server holds trainable global prototypes, a small network of its own,

    G(c) = W_2 ReLU(W_1 e_c + b_1) + b_2        (e_c: row c of a C x D embedding; W_1, W_2: D x D),

and each round trains it on the pairs {(C_i[c], c) : n_ic > 0} with adaptive-margin-enhanced
contrastive learning: with d(p, c) = ||p - G(c)||_2,

    L = (1 / |batch|) sum_{(p, y) in batch} -log( exp(-(d(p, y) + delta)) / (exp(-(d(p, y) + delta))
                                                  + sum_{c != y} exp(-d(p, c))) ),

    delta = min( max_c min_{c' != c} ||Cbar[c] - Cbar[c']||_2 , tau ),

where Cbar[c] is the plain mean of the round's prototypes of class c and the min and max run over
the classes some client sent (delta = tau when fewer than two). It runs E epochs of plain SGD
(learning rate eta, mini-batches of B pairs in a fresh random order each epoch, drawn from a generator
seeded by (seed, round)). It sends G(c) for every class to every client, whose private loss from then
on is FedProto's,

    L_i = CE(z(x), y) + lambda * ||f_i(x) - G(y)||^2 / D,

for every sample (the trained prototypes cover every class). A client's accuracies are its own
network's (its head on its own features; the authors' nearest-prototype classifier is not evaluated).

Defaults are the authors' (their run script and code): lambda = 10, tau = 100, E = 100, and the
server trains with the clients' learning rate and batch size there (0.01 and 10: here eta and B).
G is built at set-up, once every client's width D is known to agree, from a generator seeded by the
run's seed (PyTorch's default initialisation of an embedding and two linear layers). Distances are
square roots of sums of squared differences floored at 1e-12 (the authors expand the square, with no
floor), so a prototype equal to a global one cannot give a NaN gradient.

Messages: at set-up ``feature_width`` (one int32) up; then per client and round ``prototypes``
(C x D float32) and ``class_counts`` (C int32) up, ``global_prototypes`` (C x D float32) down. No
public set (``data.public_size: 0`` is allowed). DP on the prototypes is refused (the
parameter-exchange flow does not clip or noise them); so is secure aggregation (the server trains on
each client's prototypes, not on their sum).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fdlit.errors import ConfigError, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.fd import model_device
from fdlit.methods.feature_generator import seeded
from fdlit.methods.fedgh import count, labelled_prototypes, sgd_epochs
from fdlit.methods.fedproto import FedProtoClient
from fdlit.methods.lg_fedavg import check_widths

SHUFFLE, INIT = 0x7C9, 0x7C1  # tags that keep the server's seeded streams apart
TGP_KEYS = ("embedding", "hidden_weight", "hidden_bias", "out_weight", "out_bias")


def build_tgp(num_classes: int, dim: int, seed: int) -> dict[str, torch.Tensor]:
    """G's tensors, initialised as ``nn.Embedding(C, D)`` and two ``nn.Linear(D, D)`` are, from the
    run's seed alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seeded(seed, INIT).initial_seed()))
        emb, hidden, out = torch.nn.Embedding(num_classes, dim), torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)
    tensors = (emb.weight, hidden.weight, hidden.bias, out.weight, out.bias)
    return {k: t.detach().clone() for k, t in zip(TGP_KEYS, tensors, strict=True)}


def global_prototypes(tgp: dict[str, torch.Tensor]) -> torch.Tensor:
    """G(c) for every class c (C x D)."""
    hidden = F.relu(tgp["embedding"] @ tgp["hidden_weight"].T + tgp["hidden_bias"])
    return hidden @ tgp["out_weight"].T + tgp["out_bias"]


def adaptive_margin(protos: torch.Tensor, labels: torch.Tensor, num_classes: int, threshold: float) -> float:
    """delta = min(max_c min_{c' != c} ||Cbar[c] - Cbar[c']||, tau) over the classes present in
    ``labels`` (Cbar: the plain mean of each class's prototypes); tau when fewer than two are present."""
    present = torch.unique(labels)
    if len(present) < 2:
        return float(threshold)
    sums = torch.zeros(num_classes, protos.shape[-1], dtype=protos.dtype, device=protos.device).index_add_(0, labels, protos)
    means = sums[present] / torch.bincount(labels, minlength=num_classes)[present].to(protos.dtype)[:, None]
    dist = torch.cdist(means.double(), means.double())
    dist.fill_diagonal_(float("inf"))
    return float(min(dist.min(1).values.max().item(), threshold))


def margin_contrastive_loss(protos: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                            margin: float) -> torch.Tensor:
    """Mean over the rows of CE(-(d(p, .) + delta 1[. = y]), y), d(p, c) = ||p - G(c)||_2."""
    dist = (protos[:, None, :] - prototypes[None]).pow(2).sum(-1).clamp_min(1e-12).sqrt()
    dist = dist + margin * F.one_hot(labels, prototypes.shape[0]).to(dist.dtype)
    return F.cross_entropy(-dist, labels)


class FedTGPClient(FedProtoClient):
    """FedTGP's client part: FedProto's prototypes and counts up and its prototype term, towards the
    trained global prototypes of every class; its width D at set-up."""

    label = "FedTGP"
    shared_feature_width = False  # its set-up sends the width D, checked on the server before any training

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        one = ctx.data.train.x[:1].to(model_device(ctx.client))
        return {"feature_width": torch.tensor(ctx.client.predict_features(one).shape[-1], dtype=torch.int32)}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        if "global_prototypes" not in ctx.received:
            return {}
        protos = ctx.received["global_prototypes"].float().to(model_device(ctx.client))
        ctx.state["proto_global"] = protos
        ctx.state["proto_known"] = torch.ones(len(protos), device=protos.device)  # every class has one
        return {}


class FedTGP(Aggregator):
    """FedTGP (Zhang et al. 2024): global prototypes G(c) trained on the clients' prototypes with the
    adaptive-margin contrastive loss; clients' loss CE + lambda ||f(x) - G(y)||^2 / D (module docstring).

    Args:
        lam: lambda, weight of the clients' prototype term (>= 0; 0 is local training).
        margin_threshold: tau, the cap on the adaptive margin delta (>= 0).
        server_epochs: E, passes of the server's SGD over the round's (prototype, class) pairs (>= 1).
        server_lr: eta, the server's SGD learning rate (> 0).
        server_batch_size: B, pairs per server SGD step (>= 1).
    """

    short_name = "fedtgp"
    label = "FedTGP"
    exchange = "parameters"  # the parameter-exchange flow: uploads after the private phase, no public phase
    needs_public_set = False
    released = {"prototypes": "unbounded", "class_counts": "unbounded"}
    secure_refusal = "trains the global prototypes on each client's prototypes, which needs each one, not their sum"
    row_state = {"tgp": None}  # per class, not per public sample

    def __init__(self, lam: float = 10.0, margin_threshold: float = 100.0, server_epochs: int = 100,
                 server_lr: float = 0.01, server_batch_size: int = 10):
        self.lam = check_number("aggregator.lam", lam, minimum=0.0, inclusive=True)
        self.margin_threshold = check_number("aggregator.margin_threshold", margin_threshold, minimum=0.0,
                                             inclusive=True)
        self.server_epochs = count("aggregator.server_epochs", server_epochs, 1)
        self.server_lr = check_number("aggregator.server_lr", server_lr, minimum=0.0, inclusive=False)
        self.server_batch_size = count("aggregator.server_batch_size", server_batch_size, 1)
        self.tgp: dict[str, torch.Tensor] | None = None  # G's tensors, kept across rounds

    def client_part(self) -> ClientPart:
        return FedTGPClient(self.lam)

    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        self.tgp = build_tgp(ctx.info.num_classes, check_widths(uploads, self.label), ctx.info.seed)
        return {}

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        protos, labels = labelled_prototypes(uploads)
        if protos.shape[-1] != self.tgp["embedding"].shape[1]:
            raise ConfigError("model", f"{self.label} trains one set of global prototypes, so every client's width "
                              f"must be {self.tgp['embedding'].shape[1]}; got {protos.shape[-1]}")
        margin = adaptive_margin(protos, labels, ctx.info.num_classes, self.margin_threshold)
        params = [self.tgp[k].to(protos.device).clone().requires_grad_() for k in TGP_KEYS]

        def loss_of(rows):
            return margin_contrastive_loss(protos[rows], labels[rows], global_prototypes(dict(zip(TGP_KEYS, params, strict=True))),
                                           margin)

        g = seeded(ctx.info.seed, ctx.info.round, SHUFFLE)
        loss = sgd_epochs(params, loss_of, len(labels), self.server_epochs, self.server_lr, self.server_batch_size, g)
        self.tgp = {k: p.detach() for k, p in zip(TGP_KEYS, params, strict=True)}
        return AggregationResult(teacher=None, broadcast={"global_prototypes": global_prototypes(self.tgp)},
                                 stats={"fedtgp/margin": margin, "fedtgp/server_loss": loss})
