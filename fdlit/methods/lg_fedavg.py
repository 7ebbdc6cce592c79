"""LG-FedAvg: clients keep their own feature extractors and average only the head (Liang et al. 2020).

Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, *Think Locally, Act Globally:
Federated Learning with Local and Global Representations*, arXiv 2001.01523 (2020). Each client k's
network splits into a local representation f_k (``embed``) and a global part; as HtFLlib runs it
for heterogeneous networks (Zhang et al., HtFLlib, KDD 2025), the global part is the output layer
h(z) = W z + b (``classify``, one ``torch.nn.Linear``: C x D and C). Every round each client trains
its whole network on its own data (CE), sends its head, and the server averages the heads of the
clients that arrived, weighted by their training-set sizes,

    W_{t+1} = sum_{k in S_t} (n_k / n) W_{t+1}^k,   b_{t+1} likewise,   n = sum_{k in S_t} n_k,

and every client loads (W_{t+1}, b_{t+1}) into its output layer, so the next round starts from it.
The initial head is the server's, asked of one client (client 0's, as HtFLlib's server takes
client 0's head), and is loaded by every client at set-up. The feature extractors, which may differ
between clients (``fdlit.models.PerClient``), never leave them; every client's penultimate width D
must agree (checked at set-up, before round 1).

A client's accuracies are its own extractor under the averaged head it loads (after the exchange;
before it, its own head).

Messages: at set-up (round 0) ``num_samples`` (one int64) and ``feature_width`` (one int32) up from
every client and ``initial_head`` (C D + C float32) up from client 0, ``head`` down to every client;
then per client and round ``head`` (C D + C float32: the weight row-major, then the bias) up and down.
No public set (``data.public_size: 0`` is allowed). DP on the head is refused (the parameter-exchange
flow does not clip or noise it); secure aggregation runs exactly (the weighted mean is a ratio of two
sums, as FedAvg's).
"""

from __future__ import annotations

from typing import Any

import torch

from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult, Aggregator, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.feature_generator import linear_head
from fdlit.methods.fedavg import weighted_average
from fdlit.methods.parameters import flatten, load_flat
from fdlit.privacy.secure_upload import PARAMETER_BOUND


def head_vector(model: torch.nn.Module, method: str) -> torch.Tensor:
    """The client's output layer as one float32 vector: its weight (C x D, row-major), then its bias."""
    return flatten(list(linear_head(model, method).parameters())).float()


def load_head(model: torch.nn.Module, vector: torch.Tensor, method: str) -> None:
    """Copy ``vector`` (``head_vector``'s layout) into the client's output layer, in place."""
    head = linear_head(model, method)
    tensors = list(head.parameters())
    if vector.numel() != sum(t.numel() for t in tensors):
        raise ConfigError("model", f"{method} sends every client one output layer of {vector.numel()} numbers; "
                          f"this client's {type(head).__name__} has {sum(t.numel() for t in tensors)}")
    load_flat(tensors, vector.to(head.weight))


def feature_width(model: torch.nn.Module, method: str) -> torch.Tensor:
    """The input width D of the client's output layer (one int32), for the server's set-up check."""
    return torch.tensor(linear_head(model, method).in_features, dtype=torch.int32)


def check_widths(uploads: Uploads, method: str) -> int:
    """The clients' one penultimate width D; different widths are refused naming ``model``."""
    widths = sorted({int(u["feature_width"]) for u in uploads})
    if len(widths) > 1:
        raise ConfigError("model", f"{method} exchanges features or output layers of one width, so every client's "
                          f"penultimate width (the input of its output layer) must agree; got widths {widths}")
    return widths[0]


class LGFedAvgClient(ClientPart):
    """LG-FedAvg's client part: n_k, D (and, from client 0, the initial head) at set-up; its head
    every round; the averaged head loaded on receipt."""

    label = "LG-FedAvg"

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        out = {"num_samples": torch.tensor(len(ctx.data.train.y), dtype=torch.int64),
               "feature_width": feature_width(ctx.client.model, self.label)}
        if ctx.client.client_id == 0:  # the server's initial head, asked of one client (a message, counted)
            out["initial_head"] = head_vector(ctx.client.model, self.label)
        return out

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return {"head": head_vector(ctx.client.model, self.label)}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        if "head" in ctx.received:
            load_head(ctx.client.model, ctx.received["head"], self.label)
        return {}


class LGFedAvg(Aggregator):
    """LG-FedAvg (Liang et al. 2020), HtFLlib's heterogeneous form: W = sum_k (n_k / n) W_k over the
    clients' output layers; the feature extractors stay local (module docstring)."""

    short_name = "lg_fedavg"
    label = "LG-FedAvg"
    measured_network = "each client's own feature extractor under the averaged head it loads at the exchange"
    exchange = "parameters"  # the parameter-exchange flow: uploads after the private phase, no public phase
    needs_public_set = False
    released = {"head": "unbounded"}

    def __init__(self):
        self.counts: torch.Tensor | None = None  # n_k, sent once at set-up

    def client_part(self) -> ClientPart:
        return LGFedAvgClient()

    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        check_widths(uploads, self.label)
        self.counts = torch.stack([u["num_samples"].cpu() for u in uploads])
        return {"head": next(u["initial_head"] for u in uploads if "initial_head" in u)}

    def arrived_counts(self, uploads: Uploads, ctx: ServerContext) -> torch.Tensor:
        """n_k of the clients whose uploads these are (under client sampling, the round's S_t)."""
        if self.counts is None:
            return torch.ones(len(uploads), dtype=torch.int64)
        return self.counts[list(ctx.info.clients)] if ctx.info.clients else self.counts

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        shapes = {tuple(u["head"].shape) for u in uploads}
        if len(shapes) > 1:
            raise ConfigError("model", f"{self.label} averages the clients' output layers, so every client's must have "
                              f"the same shape; got {sorted(shapes)}")
        counts = self.arrived_counts(uploads, ctx).to(uploads[0]["head"].device)
        return AggregationResult(teacher=None, broadcast={"head": weighted_average([u["head"] for u in uploads], counts)})

    # secure aggregation (fdlit.privacy.secure_upload): the n_k-weighted mean is a ratio of two sums
    secure_setup = "its set-up sends each client's sample count n_k, its feature width and one client's initial head in the clear"
    secure_state = ("counts",)  # what the clients' terms read of the server's state (a deployment sends it to the nodes)

    def secure_summands(self, upload, client):
        """Client k's terms: w_k W_k and w_k, w_k = n_k / max_j n_j in (0, 1], so that
        sum_k w_k W_k / sum_k w_k is the n_k-weighted mean."""
        counts = self.counts.double() if self.counts is not None else None
        w = 1.0 if counts is None else float(counts[client] / counts.max())
        return {"weighted": (w * upload["head"].double(), PARAMETER_BOUND),
                "weight": (torch.tensor([w], dtype=torch.float64), 1.0)}

    def aggregate_sums(self, sums, ctx) -> AggregationResult:
        return AggregationResult(teacher=None, broadcast={"head": (sums.sums["weighted"] / sums.sums["weight"][0]).float()})

    def state_dict(self) -> dict[str, Any]:
        return {"counts": self.counts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = state.get("counts")
