"""FedProx: FedAvg with a proximal term in the local objective (Li et al. 2020).

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, *Federated Optimization in Heterogeneous Networks*,
MLSys 2020 (Algorithm 2). Client k minimises, from the global model w_t received last round,

    h_k(w; w_t) = F_k(w) + (mu / 2) ||w - w_t||^2

(F_k: its private cross-entropy), and the server averages as FedAvg does (weighted by n_k). The
term is added to every private step's loss (``ClientModule.parameter_terms``, from the client's
``method_state``: the centre w_t and mu), so it runs under every executor. mu = 0 is FedAvg exactly.
Messages and choices: as :mod:`fdlit.aggregators.fedavg` (the proximal term adds no message).
"""

from __future__ import annotations

import torch

from fdlit.aggregators.base import ClientContext
from fdlit.aggregators.fedavg import FedAvg, flatten
from fdlit.errors import check_number


class FedProx(FedAvg):
    """FedProx (Li et al. 2020): local loss F_k(w) + (mu/2)||w - w_t||^2, FedAvg averaging.

    Args:
        mu: proximal coefficient (>= 0; 0 is FedAvg).
    """

    short_name = "fedprox"

    def __init__(self, mu: float = 0.01):
        super().__init__()
        self.mu = check_number("aggregator.mu", mu, minimum=0.0, inclusive=True)

    def client_receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        super().client_receive(ctx)
        center = flatten(list(ctx.client.model.parameters()))  # w_t, the parameters just loaded
        ctx.state["prox_center"] = center
        ctx.state["prox_mu"] = torch.tensor(float(self.mu), dtype=center.dtype, device=center.device)
        return {}
