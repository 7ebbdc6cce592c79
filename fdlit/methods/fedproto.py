"""FedProto: clients exchange class prototypes, not parameters or predictions (Tan et al. 2022).

Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, *FedProto: Federated Prototype Learning across Heterogeneous
Clients*, AAAI 2022. f_i(x) is client i's embedding: its network's penultimate
features (the input of its output layer, ``embed(x)``: :mod:`fdlit.clients.features`). After its
private phase client i sends, for every class c it holds, its local prototype and its sample count

    C_i[c] = (1 / n_ic) sum_{(x, y) in D_i, y = c} f_i(x),     n_ic = |{(x, y) in D_i : y = c}|,

the server averages them per class, weighted by the counts (``weighting: counts``, the default),

    Cbar[c] = sum_i n_ic C_i[c] / sum_i n_ic,

or, with ``weighting: mean``, as the authors' code (``proto_aggregation``) and PFLlib do, the plain
mean over the clients holding c: Cbar[c] = (1 / |H_c|) sum_{i in H_c} C_i[c], H_c = {i : n_ic > 0}.

and sends the global prototypes (and the mask of classes some client holds) to every client. From
then on each private step's loss gains the prototype term

    L = CE(z(x), y) + lambda * ||f_i(x) - Cbar[y]||^2 / D,

over the samples whose class has a global prototype; D is the feature width (the authors' code
takes the mean squared error over the D coordinates, which is this). The features are those of the
step's own forward (``LossContext.features``). A client's accuracies are its own network's (its head
on its own features; the paper's nearest-prototype classifier is not evaluated); clients may
run different networks (``fdlit.models.PerClient``) provided their penultimate widths agree
(prototypes are averaged coordinate-wise; other widths are refused).

Messages per client and round: ``prototypes`` (C x D float32) and ``class_counts`` (C int32) up,
``global_prototypes`` (C x D float32) and ``class_mask`` (C bits) down. No public set
(``data.public_size: 0`` is allowed), no server state. DP on these uploads is refused (the
parameter-exchange flow does not clip or noise them).
"""

from __future__ import annotations

from typing import Any

import torch

from fdlit.errors import ConfigError, check_choice, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.fd import class_means, holders_average, model_device, stack_uploads

WEIGHTINGS = ("counts", "mean")  # the server's per-class average of the prototypes



def class_prototypes(ctx: ClientContext) -> dict[str, torch.Tensor]:
    """A client's class prototypes (C x D mean features of its training samples) and class counts: what
    FedProto, FedTGP and FedGH upload."""
    train = ctx.data.train
    features = ctx.client.predict_features(train.x.to(model_device(ctx.client)))
    protos, counts = class_means(features, train.y.to(features.device), ctx.info.num_classes)
    return {"prototypes": protos, "class_counts": counts.to(torch.int32)}


class FedProtoClient(ClientPart):
    """FedProto's client part: local prototypes and counts up; the prototype term in its loss."""

    label = "FedProto"
    loss_state_keys = ("proto_global", "proto_known")
    needs_features = True
    shared_feature_width = True

    def __init__(self, lam: float):
        self.lam = lam

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return class_prototypes(ctx)

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        if "global_prototypes" not in ctx.received:
            return {}
        device = model_device(ctx.client)
        ctx.state["proto_global"] = ctx.received["global_prototypes"].float().to(device)
        ctx.state["proto_known"] = ctx.received["class_mask"].float().to(device)
        return {}

    def loss(self, ctx):
        if ctx.phase != "private" or "proto_global" not in ctx.state:
            return ctx.base
        if ctx.features is None:  # a wrapper part that does not pass needs_features on
            raise ConfigError("aggregator", "FedProto's loss was given no features: the client part that wraps it "
                              "must declare needs_features")
        features = ctx.features
        target = ctx.state["proto_global"][ctx.target].to(features.dtype)  # Cbar[y], B x D
        known = ctx.state["proto_known"][ctx.target].to(features.dtype)
        per_row = known * (features - target).pow(2).mean(-1)
        return ctx.base + self.lam * per_row.mean()


class FedProto(Aggregator):
    """FedProto (Tan et al. 2022): Cbar[c] = sum_i n_ic C_i[c] / sum_i n_ic; loss CE + lambda
    ||f(x) - Cbar[y]||^2 / D (module docstring).

    Args:
        lam: weight lambda of the prototype term (>= 0; 0 is local training).
        weighting: how the server averages a class's prototypes: ``counts`` (weighted by the clients'
            sample counts n_ic) or ``mean`` (the plain mean over the clients holding the class, as
            the authors' code and PFLlib).
    """

    short_name = "fedproto"
    label = "FedProto"
    exchange = "parameters"  # the parameter-exchange flow: uploads after the private phase, no public phase
    needs_public_set = False
    released = {"prototypes": "unbounded", "class_counts": "unbounded"}

    def __init__(self, lam: float = 1.0, weighting: str = "counts"):
        self.lam = check_number("aggregator.lam", lam, minimum=0.0, inclusive=True)
        check_choice("aggregator.weighting", weighting, WEIGHTINGS)
        self.weighting = weighting

    def client_part(self) -> ClientPart:
        return FedProtoClient(self.lam)

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        protos = stack_uploads(uploads, "prototypes", "FedProto", " (every client's penultimate width must agree)")
        counts = torch.stack([u["class_counts"].to(protos.device) for u in uploads])
        weights = counts if self.weighting == "counts" else (counts > 0).to(counts.dtype)
        global_protos, held = holders_average(protos, weights)
        return AggregationResult(teacher=None, broadcast={"global_prototypes": global_protos, "class_mask": held},
                                 stats={"fedproto/held_classes": float(held.sum())})

    def state_dict(self) -> dict[str, Any]:
        return {}
