"""FML: federated mutual learning between a private and a shared ("meme") network (Shen et al. 2020).

Shen, Zhang, Jia, Zhang, Huang, Zhou, Kuang, Wu, Wu, *Federated Mutual Learning*, arXiv 2006.16765 (2020).
Every client k keeps a private network (local, personalised, never sent) and trains a copy of the
shared "meme" network on its private data; the two learn from each other by deep mutual learning.
Each private step's loss (p = softmax of a network's logits, y the label) is

    L_local = alpha * CE(p_local, y) + (1 - alpha) * KL(p_meme || p_local),
    L_meme  = beta  * CE(p_meme,  y) + (1 - beta)  * KL(p_local || p_meme),
    L       = L_local + L_meme,

averaged over the batch. In each KL term the other network's prediction is the target and is not
differentiated, so the private network descends L_local and the meme network L_meme, as two
optimizers on the two losses would (one optimizer holds both: Adam and SGD update every parameter
on its own gradient). After the private phase client k sends its meme network's parameters
w_k; the server averages them as FedAvg does,

    w = sum_k (n_k / n) w_k,   n_k = |D_k|,   n = sum over the round's arrived clients,

and sends w to every client, which loads it into its meme network.

Which network is measured (``evaluate``): by default (``private``) a client's accuracies
(``global_acc``, ``local_acc``) are its **private** network's (the pair's ``forward``), the
personalised model FML puts forward, as PFLlib's FML evaluates its clients' local models;
``evaluate: shared`` measures the meme network after the exchange instead (the averaged model, the
one comparable with FedAvg's). Training is the same under both.

The two networks per client: :class:`fdlit.models.mutual.MutualPair` (one module; any other
network is paired with a fresh copy of its own architecture). With ``fdlit.models.PerClient`` the
private networks may differ between clients; the meme network must be the same for all (refused
otherwise, naming ``model.init_args.groups``).

Messages: set-up (round 0): ``num_samples`` (int64) up from every client, ``initial_parameters``
(the meme network's P numbers, float32) up from client 0 and ``parameters`` down to every client;
every round ``parameters`` (P float32) up from every arrived client and down to every client.
Choices: temperature 1; alpha = beta = 0.5 by default (fdlit's, not the paper's); the meme network starts from one model for all clients
(client 0's initialisation, as fdlit's FedAvg); DP on the parameters is refused as for FedAvg
(``unbounded``).
"""

from __future__ import annotations

from typing import Any

import torch

from fdlit.methods.base import AggregationResult, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.fedavg import FedAvg
from fdlit.methods.mutual import (
    MutualClient,
    check_evaluate,
    check_fraction,
    check_same_length,
    per_row_ce,
    per_row_kl,
    shared_tensors,
)
from fdlit.methods.parameters import flatten
from fdlit.models.mutual import check_one_shared_network


class FMLClient(MutualClient):
    """FML's client part: the mutual loss L_local + L_meme; the meme network's parameters up, the
    average loaded into it on receipt."""

    label = "FML"

    def __init__(self, alpha: float, beta: float, evaluate: str = "private"):
        self.alpha, self.beta, self.evaluate = alpha, beta, evaluate

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return {"parameters": flatten(shared_tensors(ctx.client.model, self.label))}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        self.load_shared(ctx, ctx.received["parameters"])
        return {}

    def loss(self, ctx):
        if ctx.phase != "private":
            return ctx.base
        local, meme = self.logits(ctx)
        a, b = self.alpha, self.beta
        l_local = a * per_row_ce(local, ctx.target) + (1 - a) * per_row_kl(meme, local)
        l_meme = b * per_row_ce(meme, ctx.target) + (1 - b) * per_row_kl(local, meme)
        return ctx.mean(l_local + l_meme)


class FML(FedAvg):
    """FML (Shen et al. 2020): L_local = alpha CE + (1 - alpha) KL(meme || local), L_meme = beta CE +
    (1 - beta) KL(local || meme); the meme networks averaged as FedAvg (module docstring).

    Args:
        alpha: weight of the private network's cross-entropy, in [0, 1] (1 - alpha: its KL to the meme network).
        beta: weight of the meme network's cross-entropy, in [0, 1] (1 - beta: its KL to the private network).
        evaluate: the network each client's global and local accuracy are measured with: ``private``
            (the default: the personalised local network, the model FML puts forward) or ``shared`` (the
            meme network after the exchange, the averaged model).
    """

    short_name = "fml"
    label = "FML"
    needs_public_set = False

    def __init__(self, alpha: float = 0.5, beta: float = 0.5, evaluate: str = "private"):
        super().__init__()
        self.alpha = check_fraction("aggregator.alpha", alpha)
        self.beta = check_fraction("aggregator.beta", beta)
        self.evaluate = check_evaluate(evaluate)

    @property
    def measured_network(self) -> str:
        return ("the private network (FML's local model)" if self.evaluate == "private"
                else "the shared (meme) network, averaged at the exchange")

    def check_config(self, model: Any, client: Any) -> None:
        check_one_shared_network(model, self.label)  # the private networks may differ

    def client_part(self) -> ClientPart:
        return FMLClient(self.alpha, self.beta, self.evaluate)

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        check_same_length(uploads, "parameters", self.label)
        return super().aggregate(uploads, ctx)
