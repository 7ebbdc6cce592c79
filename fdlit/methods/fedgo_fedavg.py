"""FedGO as published: FedAvg backbone + discriminator-odds-weighted ensemble distillation (Jang et al. 2025)."""

from __future__ import annotations

from typing import Any

import torch

from fdlit.methods.base import ClientPart, ServerContext
from fdlit.methods.fedavg import FedAvgClient
from fdlit.methods.feddf import FedDF
from fdlit.methods.fedgo import FedGO, FedGOClient


class FedGOParamsClient(FedAvgClient):
    """FedGO-as-published's client part: FedAvg's set-up plus FedGO's discriminator odds."""

    def __init__(self, fedgo: FedGOClient):
        self.fedgo = fedgo

    def setup(self, ctx) -> dict[str, torch.Tensor]:
        out = super().setup(ctx)  # n_k and (client 0) the initial model
        odds = self.fedgo.setup(ctx)
        odds.pop("num_samples")  # already sent once by FedAvg's part
        return {**out, **odds}


class FedGOParams(FedDF):
    """FedGO as published (Jang, Park, Lee, *Provably Near-Optimal Federated Ensemble Distillation
    with Negligible Overhead*, ICML 2025): FedDF's round with the ensemble weighted by the client
    discriminators' odds (Theorem 4):

        w = sum_k (n_k / n) w_k                                              (FedAvg)
        W[k, x] = softmax_k( log n_k + logit D_k(x) ),  P(x) = sum_k W[k, x] softmax(f_{w_k}(x))
        w <- argmin_w  KL( P(x) || softmax(f_w(x)) ) on the public set      (``epochs`` of Adam)

    and the distilled w is broadcast. The discriminators D_k (client k's training inputs vs the
    public inputs, class-balanced) are fdlit's :class:`~fdlit.methods.fedgo.FedGO`'s:
    trained once at set-up, where the client lives, and uploaded as logit D_k on the public set
    (N numbers each, counted at round 0). FedGO's reference is a generator's distribution; here, as
    in ``FedGO``, it is the public inputs (docs/algorithms.md, "FedGO").

    Args:
        epochs, lr, batch_size: server distillation, as :class:`~fdlit.methods.feddf.FedDF`.
        discriminator_hidden: hidden width of each discriminator D_k.
        discriminator_epochs: training epochs of each discriminator D_k (once, at set-up).
    """

    short_name = "fedgo_fedavg"
    label = "FedGO (parameters)"  # how tables and figures name the method

    def __init__(self, epochs: int = 2, lr: float = 1e-3, batch_size: int = 32, discriminator_hidden: int = 64,
                 discriminator_epochs: int = 30):
        super().__init__(epochs, lr, batch_size)
        self.fedgo = FedGO(hidden=discriminator_hidden, epochs=discriminator_epochs)

    def client_part(self) -> ClientPart:
        return FedGOParamsClient(self.fedgo.client_part())

    def server_setup(self, uploads, ctx):
        broadcast = super().server_setup(uploads, ctx)
        self.fedgo.server_setup([{**u, "num_samples": u["num_samples"].reshape(1)} for u in uploads], ctx)
        return broadcast

    def ensemble(self, logits: torch.Tensor, ctx: ServerContext) -> torch.Tensor:
        _, weights = self.fedgo.round_weights(ctx, logits.device)  # the round's clients and public rows
        return self.mix(weights, logits.softmax(-1))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "fedgo": self.fedgo.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.fedgo.load_state_dict(state["fedgo"])
