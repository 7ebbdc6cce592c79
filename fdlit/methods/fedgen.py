"""FedGen: a server-trained conditional feature generator regularises the clients' heads (Zhu et al. 2021).

Zhu, Hong, Zhou, *Data-Free Knowledge Distillation for Heterogeneous Federated Learning*, ICML 2021
("FedGen"). This is the heterogeneous-model variant (as in HtFLlib's FedGen): clients keep their own
networks, which may differ (``fdlit.models.PerClient``) as long as their penultimate widths D agree.
Each client k's network splits into a feature extractor and one linear output layer (its head,
``classify``: h_k(z) = W_k z + b_k; :mod:`fdlit.clients.features`). After its private phase client k
sends its head (W_k: C x D, b_k: C) and its class counts n_k (C). The server learns a conditional
generator G_w(z | y) into the feature space (:mod:`fdlit.methods.feature_generator`) so that the
clients' heads, weighted per class by their counts, classify its output as y:

    min_w  E_{y ~ p(y), eps ~ N(0, I)} [ CE( sum_k (n_ky / sum_j n_jy) h_k(G_w(eps | y)), y ) ]
           + eta * L_div,                       p(y) = sum_k n_ky / sum_k,c n_kc,

(the paper's generator objective, its ensemble weighted per class by the counts as the authors' code
weights it; L_div the diversity term of the authors' code),
with ``generator_steps`` Adam steps of ``generator_batch`` draws per round. It sends every client the
generator's weights and the summed counts (p). From then on (round 2 on) client k's private loss is
the paper's local objective, its generated-feature term weighted by alpha (the authors' code's
weight):

    L_k = CE(h_k(f_k(x)), y) + alpha * (1/S) sum_j CE(h_k(G_w(eps_j | y_j)), y_j),   y_j ~ p,

which trains the head only (generated features are inputs). The S = ``generated`` pairs
(eps_j, y_j) are drawn once per round per client with a generator of its own seeded by (seed,
round, client), so every executor and a resumed run train alike.

How it differs from the paper: there, clients also upload their whole networks and the server
averages them (FedAvg) besides training G; here only heads and counts go up, and clients keep their
own networks (HtFLlib also averages the heads and overwrites the clients' with the mean; fdlit does
not, so heterogeneous heads stay personal). The paper draws fresh (eps, y) every local step; here one
set per round (the term must be the same under the vectorized executor). The authors' code adds a
beta-weighted KL between the client's predictions on real data and on generated features of the same
labels, and decays alpha and beta by 0.98 a round; neither is in the paper's objective, neither is
here. The noise is Gaussian (the authors' code draws uniform noise); the generator has no batch
norm; its Adam optimizer starts afresh every round (as in HtFLlib).

Messages: at set-up (round 0) each client's feature width D (``feature_width``, one int32 up), so
that the server builds G and refuses clients whose widths differ before any training; then per client
and round ``head_weight`` (C x D float32), ``head_bias`` (C float32, when the
head has a bias) and ``class_counts`` (C int32) up; ``generator`` (P float32, P = (noise + C) H + H +
H D + D) and ``label_counts`` (C int32) down. No public set (``data.public_size: 0`` is allowed). DP on
these uploads is refused (the parameter-exchange flow does not clip or noise them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fdlit.clients.features import split_network
from fdlit.errors import ConfigError, check_at_least, check_choice, check_number
from fdlit.methods.base import AggregationResult, Aggregator, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.fd import model_device
from fdlit.methods.feature_generator import (
    FeatureGenerator,
    diversity_loss,
    draw,
    ensemble_logits,
    generate,
    linear_head,
    seeded,
)
from fdlit.methods.fedavg import weighted_average

CLIENT_DRAWS, SERVER_DRAWS, INIT = 0xF6C, 0xF65, 0xF61  # tags that keep the seeded streams apart
SHARES = ("heads", "none")  # what the server shares besides the generator


def count(field: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, f"must be an integer >= {minimum}, got {value!r}")
    return check_at_least(field, value, minimum)


def global_head(weights: torch.Tensor, biases: torch.Tensor, counts: torch.Tensor,
                with_bias: bool) -> dict[str, torch.Tensor]:
    """The heads (K x C x D, K x C) averaged, each weighted by its client's sample count n_k / n, the
    counts (K x C) summed over classes (as HtFLlib's FedGen weights them)."""
    samples = counts.sum(1)
    out = {"global_head_weight": weighted_average(list(weights.flatten(1)), samples).view_as(weights[0])}
    if with_bias:
        out["global_head_bias"] = weighted_average(list(biases), samples)
    return out


class FedGenClient(ClientPart):
    """FedGen's client part: head and class counts up; generated features for its head's term."""

    label = "FedGen"
    loss_state_keys = ("fedgen_features", "fedgen_labels")
    rowwise_loss = False  # the term does not depend on the batch's rows: added once, base as given

    def __init__(self, alpha: float, generated: int, noise_dim: int, hidden: int):
        self.alpha, self.generated, self.noise_dim, self.hidden = alpha, generated, noise_dim, hidden

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        head = linear_head(ctx.client.model)  # a network without one linear output layer: refused before round 1
        return {"feature_width": torch.tensor(head.in_features, dtype=torch.int32)}

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        head = linear_head(ctx.client.model)
        y = ctx.data.train.y
        counts = torch.bincount(y.long(), minlength=ctx.info.num_classes)[:ctx.info.num_classes]
        out = {"head_weight": head.weight.detach().float().clone()}
        if head.bias is not None:
            out["head_bias"] = head.bias.detach().float().clone()
        return {**out, "class_counts": counts.to(torch.int32)}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        if "generator" not in ctx.received:
            return {}
        head = linear_head(ctx.client.model)
        if "global_head_weight" in ctx.received:  # share: heads: the averaged head replaces the client's
            with torch.no_grad():
                head.weight.copy_(ctx.received["global_head_weight"].to(head.weight))
                if head.bias is not None:
                    head.bias.copy_(ctx.received["global_head_bias"].to(head.bias))
        info = ctx.info
        g = seeded(info.seed, info.round, ctx.client.client_id, CLIENT_DRAWS)
        labels, eps = draw(ctx.received["label_counts"], self.generated, self.noise_dim, g)
        flat = ctx.received["generator"].float().cpu()
        with torch.no_grad():
            features = generate(flat, eps, labels, info.num_classes, self.hidden, head.in_features)
        device = model_device(ctx.client)
        ctx.state["fedgen_features"] = features.to(device)
        ctx.state["fedgen_labels"] = labels.to(device)
        return {}

    def loss(self, ctx):
        if ctx.phase != "private" or "fedgen_features" not in ctx.state:
            return ctx.base
        _, net = split_network(ctx.client.model)
        features = ctx.state["fedgen_features"]
        logits = net.classify(features.to(ctx.logits.dtype))  # the head's own (possibly vmapped) weights
        return ctx.base + self.alpha * F.cross_entropy(logits.float(), ctx.state["fedgen_labels"].long())


class FedGen(Aggregator):
    """FedGen (Zhu et al. 2021), heterogeneous-model variant: the server trains G_w(z | y) against the
    clients' count-weighted heads; each client's loss gains alpha * CE(h(G(eps | y)), y) (module
    docstring).

    Args:
        alpha: weight of the clients' generated-feature term (>= 0; 0 is local training).
        generated: generated features a client draws per round for its term (>= 1).
        noise_dim: width of the generator's noise input (>= 1).
        hidden: width of the generator's hidden layer (>= 1).
        generator_steps: the server's Adam steps on the generator per round (>= 1).
        generator_batch: (noise, label) draws per server step (>= 2: the diversity term compares pairs).
        generator_lr: the server's Adam learning rate (> 0).
        diversity: weight eta of the diversity term (>= 0).
    """

    short_name = "fedgen"
    label = "FedGen"
    exchange = "parameters"  # the parameter-exchange flow: uploads after the private phase, no public phase
    needs_public_set = False
    released = {"head_weight": "unbounded", "head_bias": "unbounded", "class_counts": "unbounded"}

    def __init__(self, alpha: float = 1.0, generated: int = 64, noise_dim: int = 32, hidden: int = 64,
                 generator_steps: int = 100, generator_batch: int = 64, generator_lr: float = 0.005,
                 diversity: float = 1.0, share: str = "heads"):
        check_choice("aggregator.share", share, SHARES)
        self.share = share
        self.alpha = check_number("aggregator.alpha", alpha, minimum=0.0, inclusive=True)
        self.generated = count("aggregator.generated", generated, 1)
        self.noise_dim = count("aggregator.noise_dim", noise_dim, 1)
        self.hidden = count("aggregator.hidden", hidden, 1)
        self.generator_steps = count("aggregator.generator_steps", generator_steps, 1)
        self.generator_batch = count("aggregator.generator_batch", generator_batch, 2)
        self.generator_lr = check_number("aggregator.generator_lr", generator_lr, minimum=0.0, inclusive=False)
        self.diversity = check_number("aggregator.diversity", diversity, minimum=0.0, inclusive=True)
        self.generator: FeatureGenerator | None = None

    def client_part(self) -> ClientPart:
        return FedGenClient(self.alpha, self.generated, self.noise_dim, self.hidden)

    # ------------------------------------------------------------------ server part
    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        """The generator, once every client's feature width D is known to agree (nothing goes down)."""
        widths = sorted({int(u["feature_width"]) for u in uploads})
        if len(widths) > 1:
            raise ConfigError("model", "FedGen's generator maps into one feature space, so every client's penultimate "
                              f"width (the input of its output layer) must agree; got widths {widths}")
        self.generator = self._build(ctx.info.num_classes, widths[0], ctx.info.seed)
        return {}

    def heads(self, uploads: Uploads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W: K x C x D, b: K x C, counts: K x C) of the uploads; heads of different shapes are refused."""
        shapes = {tuple(u["head_weight"].shape) for u in uploads}
        if len(shapes) > 1:
            raise ConfigError("model", "FedGen's generator maps into one feature space, so every client's output "
                              f"layer must have the same shape (C x D); got {sorted(shapes)}")
        weights = torch.stack([u["head_weight"].float() for u in uploads])
        biases = torch.stack([u["head_bias"].float() if "head_bias" in u else torch.zeros(len(u["head_weight"]),
                              device=weights.device) for u in uploads])
        counts = torch.stack([u["class_counts"].to(weights.device).float() for u in uploads])
        return weights, biases, counts

    def ensemble_loss(self, uploads: Uploads, labels: torch.Tensor, eps: torch.Tensor,
                      generator: FeatureGenerator | None = None) -> torch.Tensor:
        """CE of the count-weighted ensemble of the uploaded heads on G(eps | labels) (no diversity term)."""
        weights, biases, counts = self.heads(uploads)
        mix = counts / counts.sum(0).clamp_min(1)
        generator = generator or self.generator
        features = generator(eps.to(weights.device), labels.to(weights.device))
        return F.cross_entropy(ensemble_logits(features, labels.to(weights.device), weights, biases, mix),
                               labels.to(weights.device))

    def _build(self, num_classes: int, feature_dim: int, seed: int) -> FeatureGenerator:
        with torch.random.fork_rng(devices=[]):  # its initial weights come from the run's seed alone
            torch.manual_seed(int(seeded(seed, INIT).initial_seed()))
            return FeatureGenerator(self.noise_dim, num_classes, self.hidden, feature_dim)

    def _generator(self, feature_dim: int, num_classes: int, seed: int, device) -> FeatureGenerator:
        if self.generator is None:
            self.generator = self._build(num_classes, feature_dim, seed)
        return self.generator.to(device)

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        weights, biases, counts = self.heads(uploads)
        total = counts.sum(0)
        mix = counts / total.clamp_min(1)  # per class: each client's share of its samples
        info = ctx.info
        gen = self._generator(weights.shape[2], info.num_classes, info.seed, weights.device)
        opt = torch.optim.Adam(gen.parameters(), lr=self.generator_lr)
        g = seeded(info.seed, info.round, SERVER_DRAWS)
        gen.train()
        with torch.enable_grad():
            for _ in range(self.generator_steps):
                labels, eps = draw(total, self.generator_batch, self.noise_dim, g)
                labels, eps = labels.to(weights.device), eps.to(weights.device)
                features = gen(eps, labels)
                ce = F.cross_entropy(ensemble_logits(features, labels, weights, biases, mix), labels)
                loss = ce + self.diversity * diversity_loss(eps, features)
                opt.zero_grad()
                loss.backward()
                opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in gen.parameters()]).float()
        broadcast = {"generator": flat, "label_counts": total.to(torch.int32)}
        if self.share == "heads":
            broadcast.update(global_head(weights, biases, counts, with_bias="head_bias" in uploads[0]))
        return AggregationResult(teacher=None, broadcast=broadcast, stats={"fedgen/generator_loss": float(ce.detach())})

    def state_dict(self) -> dict[str, Any]:
        if self.generator is None:
            return {}
        return {"generator": {k: v.detach().cpu().clone() for k, v in self.generator.state_dict().items()},
                "feature_dim": self.generator.out.out_features, "num_classes": self.generator.num_classes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            self.generator = None
            return
        self.generator = self._build(state["num_classes"], state["feature_dim"], 0)  # weights: the saved ones
        self.generator.load_state_dict(state["generator"])
