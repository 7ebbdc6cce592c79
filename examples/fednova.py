"""A method written outside fdlit, with a client part and a server part: FedNova.

Wang, Liu, Liang, Joshi, Poor, *Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization*, NeurIPS 2020 (FedNova, local SGD without momentum). Client i starts the
round from the global model x, takes tau_i local SGD steps to y_i and sends its normalised update

    d_i = (x - y_i) / tau_i                 (the update per local step)

and the server, over the round's clients S with p_i = n_i / sum_{j in S} n_j, sets

    tau_eff = sum_i p_i tau_i,   x <- x - tau_eff * sum_i p_i d_i.

With equal tau_i this is FedAvg; clients with more local data take more steps, and FedNova keeps
them from pulling the global model towards their own objective (the "objective inconsistency").

Choices: tau_i counts the optimizer steps fdlit's executors take (epochs x batches, a final batch of
one sample skipped); the exchanged vector is FedAvg's (parameters and floating-point buffers); the
server keeps x. Run it from this folder (or with it on PYTHONPATH):

    python -m fdlit fit --config ../configs/digits_fedavg.yaml --config fednova.yaml
"""

from __future__ import annotations

from typing import Any

import torch

from fdlit.messages import Upload
from fdlit.methods.base import AggregationResult
from fdlit.methods.fedavg import FedAvg, FedAvgClient, exchanged_tensors, flatten
from fdlit.methods.scaffold import local_steps


class FedNovaClient(FedAvgClient):
    """Client part: remembers where the round starts (x, on receipt) and sends d_i and tau_i."""

    uploads = (Upload("normalised_update", "unbounded", shape=(None,)), Upload("local_steps", "unbounded", shape=()))

    def receive(self, ctx):
        super().receive(ctx)  # loads the global model
        ctx.state["fednova_start"] = flatten(exchanged_tensors(ctx.client.model))
        return {}

    def upload(self, ctx):
        y = flatten(exchanged_tensors(ctx.client.model))
        tau = local_steps(len(ctx.data.train.y), ctx.client.optimization.batch_size, ctx.info.private_epochs)
        update = (ctx.state["fednova_start"] - y) / max(tau, 1)
        return {"normalised_update": update, "local_steps": torch.tensor(tau, dtype=torch.int64)}


class FedNova(FedAvg):
    """Server part: x <- x - tau_eff sum_i p_i d_i (see the module docstring); holds x."""

    short_name = "fednova"

    def __init__(self):
        super().__init__()
        self.global_model: torch.Tensor | None = None

    def client_part(self) -> FedNovaClient:
        return FedNovaClient()

    def server_setup(self, uploads, ctx):
        broadcast = super().server_setup(uploads, ctx)  # n_i, and the initial model
        self.global_model = broadcast["parameters"].clone()
        return broadcast

    def aggregate(self, uploads, ctx):
        counts = self.counts[ctx.info.client_ids()].double()
        p = counts / counts.sum()
        tau = torch.stack([u["local_steps"] for u in uploads]).double()
        d = torch.stack([u["normalised_update"].double() for u in uploads])
        tau_eff = (p * tau).sum()
        x = self.global_model.to(d.device).double() - tau_eff * (p[:, None] * d).sum(0)
        self.global_model = x.to(uploads[0]["normalised_update"].dtype)
        return AggregationResult(teacher=None, broadcast={"parameters": self.global_model},
                                 stats={"fednova/tau_eff": float(tau_eff)})

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "global_model": self.global_model}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.global_model = state.get("global_model")
