"""FedProto: clients exchange class prototypes, not parameters or predictions (Tan et al. 2022).

Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, *FedProto: Federated Prototype Learning across Heterogeneous
Clients*, AAAI 2022 (Eq. 4-8, Algorithm 1). f_i(x) is client i's embedding: here the input of its
network's last linear layer (the penultimate features). After its private phase client i sends, for
every class c it holds, its local prototype and its sample count

    C_i[c] = (1 / n_ic) sum_{(x, y) in D_i, y = c} f_i(x),     n_ic = |{(x, y) in D_i : y = c}|,

the server averages them per class, weighted by the counts (Eq. 6),

    Cbar[c] = sum_i n_ic C_i[c] / sum_i n_ic,

and sends the global prototypes (and the mask of classes some client holds) to every client. From
then on each private step's loss gains the prototype term (Eq. 8)

    L = CE(z(x), y) + lambda * ||f_i(x) - Cbar[y]||^2 / D,

over the samples whose class has a global prototype; D is the feature width (the authors' code
takes the mean squared error over the D coordinates, which is this). Predictions stay each
client's own head; clients may run different networks (``fdlit.models.PerClient``) provided their
penultimate widths agree (prototypes are averaged coordinate-wise; other widths are refused).

Messages per client and round: ``prototypes`` (C x D float32) and ``class_counts`` (C int32) up,
``global_prototypes`` (C x D float32) and ``class_mask`` (C bits) down. No public set
(``data.public_size: 0`` is allowed), no server state. DP on these uploads is refused (the
parameter-exchange flow does not clip or noise them).

How the loss sees f_i(x): the step's inputs do not reach a method's loss hook, so FedProto's client
part records the input of the last ``torch.nn.Linear`` run in the process (a global module forward
pre-hook, installed once per process when the part is made or unpickled, recording only while a
FedProto part lives and never inside a compiled graph) and the loss reads it for the forward that
produced ``ctx.logits``; it checks that the recorded layer is this client network's last linear
layer. This works under every executor (the vectorized one records the batched features of its
functional call), not under ``federation.compile`` or a fused forward of several clients' networks
(refused naming ``federation.executor``). A network without a ``torch.nn.Linear`` is refused at
set-up, before any training.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from fdlit.errors import ConfigError, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.fd import class_means, holders_average, model_device, stack_uploads

_last_linear_input = threading.local()  # (module, input) of the last nn.Linear run in this thread
_capture_installed = False
_parts: weakref.WeakSet = weakref.WeakSet()  # FedProto client parts alive in this process


def _record(module: torch.nn.Module, args: tuple) -> None:
    # nothing is recorded while no FedProto part lives, nor inside a compiled graph (torch.compile
    # traces global hooks; a tensor kept from there would break other runs' compiled steps)
    if torch.compiler.is_compiling() or not _parts:  # compiling first: dynamo then reads nothing else
        return
    if isinstance(module, torch.nn.Linear):
        _last_linear_input.value = (module, args[0])


def install_feature_capture(part: ClientPart) -> None:
    """Once per process: record every nn.Linear's input while ``part`` (or another FedProto part)
    lives; FedProto's loss reads the last one."""
    global _capture_installed
    _parts.add(part)
    if not _capture_installed:
        torch.nn.modules.module.register_module_forward_pre_hook(_record)
        _capture_installed = True


def last_linear(model: torch.nn.Module) -> torch.nn.Linear:
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not layers:
        raise ConfigError("model", f"FedProto's prototypes are the input of the network's last linear layer; "
                          f"{type(model).__name__} has no torch.nn.Linear")
    return layers[-1]


def penultimate(model: torch.nn.Module) -> torch.Tensor:
    """The features of the forward that just ran (the input of the model's last linear layer)."""
    module, features = getattr(_last_linear_input, "value", (None, None))
    if module is not last_linear(model):  # the network did not run its own layers (a fused or compiled step)
        raise ConfigError("federation.executor", "FedProto reads each step's penultimate features, which a "
                          "compiled step (federation.compile) or the vectorized executor's grouped network "
                          "(conv_network: grouped/auto on a CPU) does not expose; allowed with FedProto: "
                          "federation.compile off and, for convolutional networks, conv_network: vmap")
    return features.flatten(1)


class FedProtoClient(ClientPart):
    """FedProto's client part: local prototypes and counts up; the prototype term in its loss."""

    loss_state_keys = ("proto_global", "proto_known")
    rowwise_loss = False  # the features come from the batch's forward, so it averages itself (ctx.mean)

    def __init__(self, lam: float):
        self.lam = lam
        install_feature_capture(self)

    def __setstate__(self, state: dict) -> None:  # unpickled where the clients live (Ray actors)
        self.__dict__.update(state)
        install_feature_capture(self)

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        last_linear(ctx.client.model)  # refuse a network without a feature layer before any training
        return {}

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        train, model = ctx.data.train, ctx.client.model
        seen: list[torch.Tensor] = []
        handle = last_linear(model).register_forward_pre_hook(lambda _m, args: seen.append(args[0].flatten(1)))
        try:
            ctx.client.predict_logits(train.x.to(model_device(model)))
        finally:
            handle.remove()
        features = torch.cat(seen).float()
        protos, counts = class_means(features, train.y.to(features.device), ctx.info.num_classes)
        return {"prototypes": protos, "class_counts": counts.to(torch.int32)}

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
        install_feature_capture(self)
        features = penultimate(ctx.client.model)
        target = ctx.state["proto_global"][ctx.target].to(features.dtype)  # Cbar[y], B x D
        known = ctx.state["proto_known"][ctx.target].to(features.dtype)
        per_row = known * (features - target).pow(2).mean(-1)
        return ctx.base + self.lam * ctx.mean(per_row)


class FedProto(Aggregator):
    """FedProto (Tan et al. 2022): Cbar[c] = sum_i n_ic C_i[c] / sum_i n_ic; loss CE + lambda
    ||f(x) - Cbar[y]||^2 / D (module docstring).

    Args:
        lam: weight lambda of the prototype term (>= 0; 0 is local training).
    """

    short_name = "fedproto"
    label = "FedProto"
    exchange = "parameters"  # the parameter-exchange flow: uploads after the private phase, no public phase
    needs_public_set = False
    released = {"prototypes": "unbounded", "class_counts": "unbounded"}

    def __init__(self, lam: float = 1.0):
        self.lam = check_number("aggregator.lam", lam, minimum=0.0, inclusive=True)

    def client_part(self) -> ClientPart:
        return FedProtoClient(self.lam)

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        protos = stack_uploads(uploads, "prototypes", "FedProto", " (every client's penultimate width must agree)")
        counts = torch.stack([u["class_counts"].to(protos.device) for u in uploads])
        global_protos, held = holders_average(protos, counts)
        return AggregationResult(teacher=None, broadcast={"global_prototypes": global_protos, "class_mask": held},
                                 stats={"fedproto/held_classes": float(held.sum())})

    def state_dict(self) -> dict[str, Any]:
        return {}
