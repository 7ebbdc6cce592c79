"""FedGH: a generalized global prediction head trained on the server from the clients' class-average
representations (Yi et al. 2023).

Yi, Wang, Liu, Shi, Yu, *FedGH: Heterogeneous Federated Learning with Generalized Global Header*,
ACM Multimedia 2023. Each client k's network splits into a feature extractor f_k (``embed``) and a
linear head h(z) = W z + b (``classify``, one ``torch.nn.Linear``); extractors may differ between
clients (``fdlit.models.PerClient``) as long as their width D agrees. Every round each client trains
its whole network on its own data (CE), then sends, for every class c it holds, its class-average
representation and its count,

    R_k[c] = (1 / n_kc) sum_{(x, y) in D_k, y = c} f_k(x),     n_kc = |{(x, y) in D_k : y = c}|.

The server trains the global head on the pairs {(R_k[c], c) : k in S_t, n_kc > 0} with plain SGD
(learning rate eta, mini-batches of B pairs in a fresh random order every epoch, E epochs),

    min_{W, b}  (1 / |batch|) sum_{(r, c) in batch} CE(W r + b, c),

starting from the head it holds, and every client replaces its head with (W, b). The server's head
starts as client 0's (sent once at set-up), as in the authors' code and HtFLlib, where the server
also trains with the clients' SGD learning rate and batch size; here they are the method's own
settings (defaults: HtFLlib's, eta = 0.01, B = 10, E = 100). The order of the pairs is drawn from
a generator seeded by (seed, round), so every executor and a resumed run train the same head.

A client's accuracies are its own extractor under the global head it loads (after the exchange;
before it, its own head trained in the private phase).

Messages: at set-up (round 0) ``feature_width`` (one int32) up from every client, ``initial_head``
(C D + C float32) up from client 0 and ``head`` down to every client; then per client and round
``prototypes`` (C x D float32) and ``class_counts`` (C int32) up, ``head`` (C D + C float32: the
weight row-major, then the bias) down. No public set (``data.public_size: 0`` is allowed). DP on the
representations is refused (the parameter-exchange flow does not clip or noise them); so is secure
aggregation (the server trains on each client's representations, not on their sum).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.feature_generator import seeded
from fdlit.methods.fedproto import class_prototypes
from fdlit.methods.lg_fedavg import check_widths, feature_width, head_vector, load_head

SHUFFLE = 0xF64  # tag of the server's shuffling stream


def count(field: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, f"must be an integer >= {minimum}, got {value!r}")
    return check_at_least(field, value, minimum)


def labelled_prototypes(uploads: Uploads) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs (R_k[c], c) over the uploads and the classes each holds (n_kc > 0), in upload order
    then class order: (P x D float32, P int64)."""
    protos = torch.cat([u["prototypes"].float()[u["class_counts"] > 0] for u in uploads])
    labels = torch.cat([torch.nonzero(u["class_counts"] > 0).flatten() for u in uploads]).to(protos.device)
    return protos, labels


def sgd_epochs(params: list[torch.Tensor], loss_of, n: int, epochs: int, lr: float, batch: int,
               generator: torch.Generator) -> float:
    """``epochs`` passes of plain SGD (step lr * gradient) over ``n`` rows in mini-batches of ``batch``,
    each epoch in a fresh order drawn from ``generator``; ``loss_of(rows)`` is a mini-batch's mean
    loss. Updates ``params`` (leaf tensors) in place; returns the last mini-batch's loss."""
    loss = torch.zeros(())
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator).to(params[0].device)
            for start in range(0, n, batch):
                loss = loss_of(order[start:start + batch])
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, g in zip(params, grads, strict=True):
                        p -= lr * g
    return float(loss.detach())


class FedGHClient(ClientPart):
    """FedGH's client part: D (and, from client 0, the initial head) at set-up; its class-average
    representations and counts every round; the global head loaded on receipt."""

    label = "FedGH"

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        out = {"feature_width": feature_width(ctx.client.model, self.label)}
        if ctx.client.client_id == 0:  # the server's initial head (a message, counted)
            out["initial_head"] = head_vector(ctx.client.model, self.label)
        return out

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return class_prototypes(ctx)  # class-average representations, as FedProto's

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        if "head" in ctx.received:
            load_head(ctx.client.model, ctx.received["head"], self.label)
        return {}


class FedGH(Aggregator):
    """FedGH (Yi et al. 2023): the server trains the global head on the clients' class-average
    representations, min CE(W R_k[c] + b, c), and every client loads it (module docstring).

    Args:
        server_epochs: E, passes of the server's SGD over the round's (representation, class) pairs (>= 1).
        server_lr: eta, the server's SGD learning rate (> 0).
        server_batch_size: B, pairs per server SGD step (>= 1).
    """

    short_name = "fedgh"
    label = "FedGH"
    measured_network = "each client's own feature extractor under the global head it loads at the exchange"
    exchange = "parameters"  # the parameter-exchange flow: uploads after the private phase, no public phase
    needs_public_set = False
    released = {"prototypes": "unbounded", "class_counts": "unbounded"}
    secure_refusal = "trains the server's head on each client's class representations, which needs each one, not their sum"
    row_state = {"weight": None, "bias": None}  # per class, not per public sample

    def __init__(self, server_epochs: int = 100, server_lr: float = 0.01, server_batch_size: int = 10):
        self.server_epochs = count("aggregator.server_epochs", server_epochs, 1)
        self.server_lr = check_number("aggregator.server_lr", server_lr, minimum=0.0, inclusive=False)
        self.server_batch_size = count("aggregator.server_batch_size", server_batch_size, 1)
        self.weight: torch.Tensor | None = None  # the global head (C x D, C), kept across rounds
        self.bias: torch.Tensor | None = None

    def client_part(self) -> ClientPart:
        return FedGHClient()

    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        d, c = check_widths(uploads, self.label), ctx.info.num_classes
        initial = next(u["initial_head"] for u in uploads if "initial_head" in u).float()
        self.weight = initial[:c * d].view(c, d).clone()
        self.bias = initial[c * d:].clone() if initial.numel() == c * d + c else None
        return {"head": initial}

    def head(self) -> torch.Tensor:
        return torch.cat([self.weight.reshape(-1), *([] if self.bias is None else [self.bias])])

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        protos, labels = labelled_prototypes(uploads)
        if protos.shape[-1] != self.weight.shape[1]:
            raise ConfigError("model", f"{self.label} trains one head on every client's representations, so every "
                              f"client's width must be {self.weight.shape[1]}; got {protos.shape[-1]}")
        params = [self.weight.to(protos.device).clone().requires_grad_()]
        if self.bias is not None:
            params.append(self.bias.to(protos.device).clone().requires_grad_())

        def loss_of(rows):
            logits = protos[rows] @ params[0].T + (params[1] if len(params) > 1 else 0)
            return F.cross_entropy(logits, labels[rows])

        g = seeded(ctx.info.seed, ctx.info.round, SHUFFLE)
        loss = sgd_epochs(params, loss_of, len(labels), self.server_epochs, self.server_lr, self.server_batch_size, g)
        self.weight = params[0].detach()
        self.bias = params[1].detach() if len(params) > 1 else None
        return AggregationResult(teacher=None, broadcast={"head": self.head()},
                                 stats={"fedgh/server_loss": loss, "fedgh/pairs": float(len(labels))})
