"""FedGO: client-discriminator odds weighting (Jang et al. 2025, Theorem 4)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart


def train_discriminator(own: torch.Tensor, reference: torch.Tensor, hidden: int = 64, epochs: int = 30,
                        lr: float = 1e-3, weight_decay: float = 1e-4, batch_size: int = 128,
                        seed: int = 0) -> nn.Module:
    """D(x) = sigmoid(net(x)): ``own`` inputs (label 1) vs ``reference`` inputs (label 0).

    Class-balanced binary cross-entropy (each side weighs 1/2 whatever its size), so the optimum is
    D = p_k / (p_k + p_ref) and the odds D / (1 - D) = p_k / p_ref, as Theorem 4 of FedGO needs; an
    unbalanced loss would scale client k's odds by its own |own| / |reference| and bias the weights.
    """
    x = torch.cat([own.flatten(1), reference.flatten(1)]).float()
    y = torch.cat([torch.ones(len(own)), torch.zeros(len(reference))]).to(x.device)
    w = torch.where(y > 0, 0.5 / len(own), 0.5 / len(reference)) * len(x)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching the global stream
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, 1)).to(x.device)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=g).to(x.device)
            for start in range(0, len(x), batch_size):
                idx = order[start : start + batch_size]
                loss = nn.functional.binary_cross_entropy_with_logits(net(x[idx])[:, 0], y[idx], weight=w[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return net.eval()


class FedGOClient(ClientPart):
    """FedGO's client part: the discriminator D_k, trained once where the client lives."""

    def __init__(self, hidden: int, epochs: int, lr: float, weight_decay: float, send: str):
        self.hidden, self.epochs, self.lr, self.weight_decay, self.send = hidden, epochs, lr, weight_decay, send

    def setup(self, ctx):
        """Client side, once: train D_k on the local training inputs against the public inputs."""
        public = ctx.info.public_x
        net = train_discriminator(ctx.data.train.x.to(public.device), public, self.hidden, self.epochs, self.lr,
                                  self.weight_decay, seed=ctx.info.client_seed(ctx.client.client_id))
        out = {"num_samples": torch.tensor([len(ctx.data.train)], dtype=torch.int64)}
        if self.send == "scores":
            with torch.no_grad():
                out["discriminator_log_odds"] = net(public.flatten(1).float())[:, 0]
        else:
            out.update({f"discriminator/{name}": p.detach() for name, p in net.named_parameters()})
        return out


class FedGO(Aggregator):
    """FedGO (Jang, Park, Lee, *Provably Near-Optimal Federated Ensemble Distillation with Negligible
    Overhead*, ICML 2025; Theorem 4):

        Phi_k(x) = D_k(x) / (1 - D_k(x)),   W[k, x] = n_k Phi_k(x) / sum_i n_i Phi_i(x),
        P(x) = sum_k W[k, x] Q_k(x)

    computed in log space: W[:, x] = softmax_k( log n_k + logit D_k(x) ). With equal odds and equal
    n_k it is AVG. Theorem 4: for optimal discriminators against a common reference p_g, W is the
    optimal n_k p_k(x) / sum_i n_i p_i(x).

    Before federation (:class:`FedGOClient`'s ``setup``, once, where the client lives), client k trains D_k on its training inputs (label 1)
    against the public inputs (label 0), class-balanced; it uploads n_k and either D_k evaluated on
    the public set (``upload: scores``, N numbers: logit D_k(x) = log Phi_k(x)) or D_k's parameters
    (``upload: parameters``; the server rebuilds D_k and evaluates it). Both are counted at round 0.

    Choices (docs/algorithms.md **unclear** / **choice**):
      - reference distribution: the public inputs (FedGO uses a generator; with a public set its inputs
        serve, as docs/algorithms.md says);
      - discriminator: MLP on flattened inputs, one hidden ReLU layer of ``hidden`` units, Adam,
        ``epochs`` epochs, batch 128, weight decay ``weight_decay``; balanced BCE (see
        :func:`train_discriminator`); its initialisation and batch order seeded by (seed, client);
      - n_k = the client's training-split size (the calibration split is not trained on);
      - D_k is evaluated on the same public inputs it saw as negatives; no held-out split is used.

    Args:
        hidden: hidden units of the discriminator (>= 1).
        epochs: training epochs (>= 1).
        lr: Adam learning rate (> 0).
        weight_decay: Adam L2 (>= 0).
        upload: ``scores`` or ``parameters``.
    """

    short_name = "fedgo"
    label = "FedGO"  # how tables and figures name the method

    def __init__(self, hidden: int = 64, epochs: int = 30, lr: float = 1e-3, weight_decay: float = 1e-4,
                 upload: Literal["scores", "parameters"] = "scores"):
        check_at_least("aggregator.hidden", hidden, 1)
        check_at_least("aggregator.epochs", epochs, 1)
        check_number("aggregator.lr", lr)
        check_number("aggregator.weight_decay", weight_decay, inclusive=True)
        if upload not in ("scores", "parameters"):
            raise ConfigError("aggregator.upload", f"allowed: 'scores', 'parameters'; got {upload!r}")
        self.hidden, self.epochs, self.lr, self.weight_decay = hidden, epochs, lr, weight_decay
        self.upload = upload
        self.log_odds: torch.Tensor | None = None  # M x N, logit D_k(x) on the public set
        self.log_counts: torch.Tensor | None = None  # M, log n_k

    def discriminator(self, input_dim: int) -> nn.Module:
        return nn.Sequential(nn.Linear(input_dim, self.hidden), nn.ReLU(), nn.Linear(self.hidden, 1))

    def client_part(self) -> ClientPart:
        return FedGOClient(self.hidden, self.epochs, self.lr, self.weight_decay, self.upload)

    def server_setup(self, uploads, ctx):
        public = ctx.info.public_x.flatten(1).float()
        log_odds = []
        for u in uploads:
            if self.upload == "scores":
                log_odds.append(u["discriminator_log_odds"].to(public.device))
                continue
            net = self.discriminator(public.shape[1]).to(public.device)  # D_k rebuilt from its parameters
            net.load_state_dict({k.removeprefix("discriminator/"): v for k, v in u.items()
                                 if k.startswith("discriminator/")})
            with torch.no_grad():
                log_odds.append(net(public)[:, 0])
        counts = torch.cat([u["num_samples"] for u in uploads])
        self.set_discriminator_scores(torch.stack(log_odds), counts.to(public.device))
        return {}

    def set_discriminator_scores(self, log_odds: torch.Tensor, counts: torch.Tensor) -> None:
        """log_odds: M x N, logit D_k(x) = log Phi_k(x) on the public set; counts: M sample counts n_k."""
        self.log_odds = log_odds.double()
        self.log_counts = torch.log(counts.double().to(log_odds.device))

    def state_dict(self):
        return {"log_odds": self.log_odds, "log_counts": self.log_counts}

    def load_state_dict(self, state):
        self.log_odds, self.log_counts = state["log_odds"], state["log_counts"]

    def aggregate(self, uploads, ctx):
        if self.log_odds is None:
            raise RuntimeError("FedGO has no discriminators: run its set-up or set_discriminator_scores")
        z = self.stack_logits(uploads)
        log_odds, weights = self.round_weights(ctx, z.device)
        return AggregationResult(teacher=self.mix(weights, z.softmax(-1)), weights=weights,
                                 stats={"fedgo/log_odds_mean": float(log_odds.mean())})

    def round_weights(self, ctx, device) -> tuple[torch.Tensor, torch.Tensor]:
        """This round's log-odds and weights w_k(x) = softmax_k(log D_k/(1-D_k) + log n_k), over the
        clients that arrived and the round's public rows."""
        log_odds, log_counts = ctx.info.rows(self.log_odds), self.log_counts
        if ctx.info.clients:
            log_counts = log_counts[torch.tensor(ctx.info.clients, device=log_counts.device)]
        score = log_odds.to(device) + log_counts.to(device)[:, None]
        return log_odds, torch.softmax(score, dim=0).float()
