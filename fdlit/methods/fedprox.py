"""FedProx: FedAvg with a proximal term in the local objective (Li et al. 2020).

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, *Federated Optimization in Heterogeneous Networks*,
MLSys 2020 (Algorithm 2). Client k minimises, from the global model w_t received last round,

    h_k(w; w_t) = F_k(w) + (mu / 2) ||w - w_t||^2

(F_k: its private cross-entropy), and the server averages as FedAvg does (weighted by n_k). The
term is added to every private step's loss by FedProx's client part (:class:`FedProxClient`, from
the client's ``method_state``: the centre w_t and mu), so it runs under every executor. mu = 0 is FedAvg exactly.
Messages and choices: as :mod:`fdlit.methods.fedavg` (the proximal term adds no message).
"""

from __future__ import annotations

import torch

from fdlit.errors import check_number
from fdlit.methods.base import ClientContext, ClientPart
from fdlit.methods.fedavg import FedAvg, FedAvgClient, flatten, parameter_slices


class FedProxClient(FedAvgClient):
    """FedProx's client part: keeps w_t on receipt; the private loss gains (mu/2)||w - w_t||^2."""

    loss_state_keys = ("prox_center", "prox_mu")
    rowwise_loss = False  # a term of the parameters added to the client's own (exact) loss

    def __init__(self, mu: float):
        self.mu = mu

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        super().receive(ctx)
        center = flatten(list(ctx.client.model.parameters()))  # w_t, the parameters just loaded
        ctx.state["prox_center"] = center
        ctx.state["prox_mu"] = torch.tensor(float(self.mu), dtype=center.dtype, device=center.device)
        return {}

    def loss(self, ctx):
        state = ctx.state
        if ctx.phase != "private" or "prox_center" not in state:
            return ctx.base
        mu, total = state["prox_mu"], 0.0
        for p, center in parameter_slices(ctx.client.model, state["prox_center"]):
            total = total + 0.5 * mu * (p - center).pow(2).sum()
        return ctx.base + total


class FedProx(FedAvg):
    """FedProx (Li et al. 2020): local loss F_k(w) + (mu/2)||w - w_t||^2, FedAvg averaging.

    Args:
        mu: proximal coefficient (>= 0; 0 is FedAvg).
    """

    short_name = "fedprox"
    label = "FedProx"  # how tables and figures name the method

    def __init__(self, mu: float = 0.01):
        super().__init__()
        self.mu = check_number("aggregator.mu", mu, minimum=0.0, inclusive=True)

    def client_part(self) -> ClientPart:
        return FedProxClient(self.mu)
