"""SCAFFOLD: FedAvg with control variates that correct client drift (Karimireddy et al. 2020).

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, *SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning*, ICML 2020 (Algorithm 1, option II, global step size eta_g = 1, every client
every round). Client i starts from the global model x with the server control variate c and its
own c_i, and takes K local SGD steps

    y_i <- y_i - eta (g_i(y_i) + c - c_i),

written as the linear loss term <w, c - c_i> whose gradient is exactly c - c_i
(:class:`ScaffoldClient`'s ``loss``; under the vectorized executor each client reads its own slice).
After the private phase (option II)

    c_i+ = c_i - c + (x - y_i) / (K eta),

K = the client's optimizer steps this round (epochs x its batches), eta = ``client.lr``. It sends
y_i and Delta c_i = c_i+ - c_i; the server sets x <- sum_i (n_i / n) y_i (FedAvg's weighting; the
paper's uniform mean when the n_i are equal) and c <- c + (1/N) sum_i Delta c_i, so c stays the mean
of the c_i, and sends x and c down. Both control variates travel: per client and round SCAFFOLD
sends twice FedAvg's bytes (control variates cover the parameters, not BatchNorm buffers).

The update assumes plain SGD steps: ``client.optimizer`` must be ``sgd`` with ``client.momentum`` 0
(weight decay is part of the gradient and allowed). Set-up and heterogeneity: as FedAvg.
"""

from __future__ import annotations

from typing import Any

import torch

from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.fedavg import FedAvg, FedAvgClient, flatten, parameter_slices


def local_steps(n: int, batch_size: int, epochs: int) -> int:
    """K: optimizer steps of a private phase (fdlit's executors skip a final batch of one sample)."""
    batches = -(-n // batch_size) - (1 if n > 1 and n % batch_size == 1 else 0)
    return epochs * batches


class ScaffoldClient(FedAvgClient):
    """SCAFFOLD's client part: c and c_i in the client's state, the correction <w, c - c_i> in its
    private loss, option II's update of c_i after the private phase."""

    loss_state_keys = ("linear_term",)
    rowwise_loss = False  # a term of the parameters added to the client's own (exact) loss

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        super().receive(ctx)
        x = flatten(list(ctx.client.model.parameters()))
        state = ctx.state
        c = ctx.received.get("control")
        state["scaffold_x"] = x
        state["scaffold_c"] = torch.zeros_like(x) if c is None else c.to(x.device, x.dtype)
        state.setdefault("scaffold_c_i", torch.zeros_like(x))
        state["linear_term"] = state["scaffold_c"] - state["scaffold_c_i"]
        return {}

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        state = ctx.state
        y = flatten(list(ctx.client.model.parameters()))
        opt = ctx.client.optimization
        k = local_steps(len(ctx.data.train.y), opt.batch_size, ctx.info.private_epochs)
        c_i = state["scaffold_c_i"]
        # option II; a client that took no step keeps its control variate
        new = c_i - state["scaffold_c"] + (state["scaffold_x"] - y) / (k * opt.lr) if k > 0 else c_i
        state["scaffold_c_i"] = new
        return {**super().upload(ctx), "control_delta": new - c_i}

    def loss(self, ctx):
        state = ctx.state
        if ctx.phase != "private" or "linear_term" not in state:
            return ctx.base
        total = 0.0
        for p, g in parameter_slices(ctx.client.model, state["linear_term"]):
            total = total + (p * g).sum()
        return ctx.base + total


class Scaffold(FedAvg):
    """SCAFFOLD option II (Karimireddy et al. 2020): c_i+ = c_i - c + (x - y_i)/(K eta) (module docstring)."""

    short_name = "scaffold"
    label = "SCAFFOLD"  # how tables and figures name the method
    released = {"parameters": "unbounded", "control_delta": "unbounded"}

    def __init__(self):
        super().__init__()
        self.control: torch.Tensor | None = None  # c, the server control variate (0 before round 1)

    def check_config(self, model: Any, client: Any) -> None:
        super().check_config(model, client)
        if client is None:
            return
        if client.optimizer != "sgd":
            raise ConfigError("client.optimizer", "SCAFFOLD's control-variate update assumes plain SGD steps; "
                              f"allowed: 'sgd'; got {client.optimizer!r}")
        if client.momentum != 0:
            raise ConfigError("client.momentum", f"SCAFFOLD assumes plain SGD steps; allowed: 0; got {client.momentum}")

    def client_part(self) -> ClientPart:
        return ScaffoldClient()

    # ------------------------------------------------------------------ server part
    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        result = super().aggregate(uploads, ctx)
        deltas = torch.stack([u["control_delta"] for u in uploads])
        control = torch.zeros_like(deltas[0]) if self.control is None else self.control.to(deltas.device)
        # c <- c + (1/N) sum_{i in S} delta c_i (Karimireddy et al. 2020, Alg. 1): N counts every
        # client, not only those whose upload arrived this round, so c stays the mean of all c_i
        self.control = control + deltas.sum(0) / ctx.info.num_clients
        result.broadcast["control"] = self.control
        result.stats["scaffold/control_norm"] = float(self.control.norm())
        return result

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "control": self.control}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.control = state.get("control")
