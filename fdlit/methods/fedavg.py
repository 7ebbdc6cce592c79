"""FedAvg: clients exchange parameters, the server averages them (McMahan et al. 2017).

Federated Averaging (McMahan, Moore, Ramage, Hampson, Agüera y Arcas, *Communication-Efficient
Learning of Deep Networks from Decentralized Data*, AISTATS 2017, Algorithm 1). Every round each
client k starts from the global model w_t, trains its private phase (``federation.private_epochs``
epochs of the client optimizer) to w_{t+1}^k, and the server sets

    w_{t+1} = sum_k (n_k / n) w_{t+1}^k,   n_k = |D_k|, n = sum_k n_k.

Messages (in the dtype the model holds its parameters, float32: 4 bytes a number), per client:
``parameters`` up and ``parameters`` down every round (2 x P x 4 bytes for P numbers), and at
set-up (round 0) ``num_samples`` up (one int64), the initial model up from client 0 and down to every client. The exchanged vector is
every parameter plus every floating-point buffer (BatchNorm's running mean and variance, averaged
like parameters as FedAvg implementations do, and counted); integer buffers (BatchNorm's
``num_batches_tracked``) stay local: they only matter with ``momentum=None``.

Choices: the initial model w_0 is the server's, asked of one client (client 0's initialisation, sent
up once at set-up and counted, as Flower's FedAvg asks one client for its initial parameters), and
is sent down to every client at set-up; every client
keeps its own optimizer state across rounds (fdlit's client keeps one optimizer for the run; with
plain SGD and no momentum, as in the paper, there is none). Every client runs the same architecture:
a heterogeneous federation (``fdlit.models.PerClient`` with different groups) is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult, Aggregator, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.parameters import exchanged_tensors, flatten, load_flat, parameter_slices  # noqa: F401
from fdlit.privacy.secure_upload import PARAMETER_BOUND


def weighted_average(vectors: list[torch.Tensor], counts: torch.Tensor) -> torch.Tensor:
    """sum_k (n_k / n) v_k; one client's weight is exactly 1.0, so one client's vector comes back unchanged."""
    weights = (counts.double() / counts.double().sum()).to(vectors[0].dtype)
    return (weights[:, None] * torch.stack(vectors)).sum(0)


def check_homogeneous(model: Any, method: str = "parameter exchange (FedAvg, FedProx, SCAFFOLD)") -> None:
    """Parameter exchange needs one architecture: refuse a PerClient spec whose groups differ."""
    if not isinstance(model, dict) or not str(model.get("class_path", "")).endswith("PerClient"):
        return
    groups = (model.get("init_args") or {}).get("groups") or []
    specs = {repr((g.get("class_path"), sorted((g.get("init_args") or {}).items()))) for g in groups}
    if len(specs) > 1:
        raise ConfigError("model.class_path", f"{method} averages the clients' parameters, so every client needs "
                          "the same architecture; allowed: one model spec for all clients, "
                          f"got fdlit.models.PerClient with {len(specs)} different groups")


class FedAvgClient(ClientPart):
    """FedAvg's client part: n_k (and, from client 0, the initial model) at set-up, its parameters
    every round, the global model loaded on receipt."""

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        out = {"num_samples": torch.tensor(len(ctx.data.train.y), dtype=torch.int64)}
        if ctx.client.client_id == 0:  # the server's initial model, asked of one client (a message, counted)
            out["initial_parameters"] = flatten(exchanged_tensors(ctx.client.model))
        return out

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return {"parameters": flatten(exchanged_tensors(ctx.client.model))}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        load_flat(exchanged_tensors(ctx.client.model), ctx.received["parameters"])
        return {}


class FedAvg(Aggregator):
    """FedAvg (McMahan et al. 2017): w_{t+1} = sum_k (n_k / n) w_{t+1}^k (see the module docstring)."""

    short_name = "fedavg"
    label = "FedAvg"  # how tables and figures name the method
    measured_network = "the averaged model each client loads at the exchange (before it, its own copy)"
    released = {"parameters": "unbounded"}
    exchange = "parameters"

    def __init__(self):
        self.counts: torch.Tensor | None = None  # n_k, sent once at set-up

    def check_config(self, model: Any, client: Any) -> None:
        check_homogeneous(model, self.label or type(self).__name__)

    def client_part(self) -> ClientPart:
        return FedAvgClient()

    # ------------------------------------------------------------------ server part
    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        self.counts = torch.stack([u["num_samples"].cpu() for u in uploads])
        return {"parameters": next(u["initial_parameters"] for u in uploads if "initial_parameters" in u)}

    def average(self, uploads: Uploads, ctx: ServerContext, key: str = "parameters") -> torch.Tensor:
        """The n_k-weighted mean over the uploads that arrived (under client sampling, McMahan et
        al. 2017 average over the round's clients S_t: n = sum_{k in S_t} n_k)."""
        counts = self.counts if self.counts is not None else torch.ones(len(uploads), dtype=torch.int64)
        if self.counts is not None and ctx.info.clients:
            counts = counts[list(ctx.info.clients)]
        return weighted_average([u[key] for u in uploads], counts.to(uploads[0][key].device))

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        return AggregationResult(teacher=None, broadcast={"parameters": self.average(uploads, ctx)})

    # secure aggregation (fdlit.privacy.secure_upload): the n_k-weighted mean is a ratio of two sums
    secure_setup = "its set-up sends each client's sample count n_k and one client's initial model in the clear"
    secure_state = ("counts",)  # what the clients' terms read of the server's state (a deployment sends it to the nodes)

    def secure_summands(self, upload, client):
        """Client k's terms: w_k theta_k and w_k, w_k = n_k / max_j n_j in (0, 1] (every n_j went to the
        server at set-up), so that sum_k w_k theta_k / sum_k w_k is the n_k-weighted mean."""
        counts = self.counts.double() if self.counts is not None else None
        w = 1.0 if counts is None else float(counts[client] / counts.max())
        return {"weighted": (w * upload["parameters"].double(), PARAMETER_BOUND),
                "weight": (torch.tensor([w], dtype=torch.float64), 1.0)}

    def aggregate_sums(self, sums, ctx) -> AggregationResult:
        mean = sums.sums["weighted"] / sums.sums["weight"][0]
        return AggregationResult(teacher=None, broadcast={"parameters": mean.float()})

    def model_shares(self, arrived: list[int]) -> list[float] | None:
        if self.counts is None:
            return None
        counts = self.counts.double()[list(arrived)]
        return (counts / counts.sum()).tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"counts": self.counts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = state.get("counts")
