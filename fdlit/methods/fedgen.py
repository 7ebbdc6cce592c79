"""FedGen: a server-trained conditional feature generator regularises the clients' heads (Zhu et al. 2021).

Zhu, Hong, Zhou, *Data-Free Knowledge Distillation for Heterogeneous Federated Learning*, ICML 2021
("FedGen"). Each client k's network splits into a feature extractor f_k and one linear output layer
(its head, ``classify``: h_k(z) = W_k z + b_k; :mod:`fdlit.clients.features`). After its private
phase client k sends its head (W_k: C x D, b_k: C) and its class counts n_k (C). The server learns a
conditional generator G_w(z | y) into the feature space (:mod:`fdlit.methods.feature_generator`) so
that the clients' heads, weighted per class by their counts, classify its output as y:

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

What the server shares besides G (``share``):

- ``parameters`` (the paper's setting, Zhu et al. 2021): whole networks go up instead of heads and
  are averaged as FedAvg averages them (:class:`fdlit.methods.fedavg.FedAvg`, weighted by n_k, the
  initial model from client 0 at set-up), the server reads each head out of its parameter vector
  (where it lies is sent once at set-up), and the global network comes down with G. One
  architecture for every client: a ``PerClient`` spec with different groups is refused naming
  ``model.class_path``.
- ``heads`` (HtFLlib's heterogeneous-model FedGen, not the paper's): the server also averages the
  uploaded heads, each weighted by its client's sample count n_k / n (n_k = sum_c n_kc; HtFLlib
  weights them by the training-sample counts, not per class), and sends the global head down; each
  client loads it into its output layer on receipt, so the next round starts from it. Clients keep
  their own feature extractors, which may differ (``fdlit.models.PerClient``) as long as D agrees.
- ``none``: heads stay local (nothing reaches a client's head about classes it does not hold, so on
  a class-partitioned federation the generator alone barely helps); kept for comparison.
- ``auto`` (the default): ``parameters`` when every client has the same network; ``heads``, with a
  one-line warning, when the clients' networks differ (a ``PerClient`` spec with different groups),
  where whole networks cannot be averaged and HtFLlib's variant is the FedGen that runs.

A client's accuracies are its own network's as it holds it after the round's exchange (with
``parameters`` the averaged network, with ``heads`` its own extractor under the global head); the
server's generator is not evaluated.

Other differences from the paper: it draws fresh (eps, y) every local step; here one
set per round (the term must be the same under the vectorized executor). The authors' code adds a
beta-weighted KL between the client's predictions on real data and on generated features of the same
labels, and decays alpha and beta by 0.98 a round; neither is in the paper's objective, neither is
here. The noise is Gaussian (the authors' code draws uniform noise); the generator has no batch
norm; its Adam optimizer starts afresh every round (as in HtFLlib).

Messages: at set-up (round 0) each client's feature width D (``feature_width``, one int32 up), so
that the server builds G and refuses clients whose widths differ before any training; then per client
and round ``head_weight`` (C x D float32), ``head_bias`` (C float32, when the
head has a bias) and ``class_counts`` (C int32) up; ``generator`` (P_G float32, P_G = (noise + C) H +
H + H D + D) and ``label_counts`` (C int32) down; with ``share: heads`` also ``global_head_weight``
(C x D float32) and ``global_head_bias`` (C float32) down. With ``share: parameters``, ``parameters``
(P float32, the network) goes up in place of the head and down besides G, and the set-up adds
FedAvg's ``num_samples`` (int64 up), ``initial_parameters`` (P up, client 0) and ``parameters`` (P
down), and ``head_slices`` (two int64 up). No public set (``data.public_size: 0`` is allowed). DP on
these uploads is refused (the parameter-exchange flow does not clip or noise them).
"""

from __future__ import annotations

import warnings
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
from fdlit.methods.fedavg import FedAvg, FedAvgClient, check_homogeneous, weighted_average
from fdlit.methods.parameters import exchanged_tensors

CLIENT_DRAWS, SERVER_DRAWS, INIT = 0xF6C, 0xF65, 0xF61  # tags that keep the seeded streams apart
SHARES = ("auto", "parameters", "heads", "none")  # what the server shares besides the generator


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


def head_slices(model: torch.nn.Module, head: torch.nn.Linear) -> torch.Tensor:
    """Where the head's weight and bias start in the exchanged parameter vector (-1: no bias), so
    the server reads the heads out of the parameters it averages."""
    starts, offset = [-1, -1], 0
    for t in exchanged_tensors(model):
        if t is head.weight:
            starts[0] = offset
        elif t is head.bias:
            starts[1] = offset
        offset += t.numel()
    return torch.tensor(starts, dtype=torch.int64)


class FedGenClient(ClientPart):
    """FedGen's client part: head (or, with ``share: parameters``, the whole network) and class counts
    up; the global head or network loaded on receipt; generated features for its head's term."""

    label = "FedGen"
    loss_state_keys = ("fedgen_features", "fedgen_labels")
    rowwise_loss = False  # the term does not depend on the batch's rows: added once, base as given

    def __init__(self, alpha: float, generated: int, noise_dim: int, hidden: int, share: str = "parameters"):
        self.alpha, self.generated, self.noise_dim, self.hidden = alpha, generated, noise_dim, hidden
        self.fedavg = FedAvgClient() if share == "parameters" else None  # FedAvg's messages and loading

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        head = linear_head(ctx.client.model)  # a network without one linear output layer: refused before round 1
        out = {"feature_width": torch.tensor(head.in_features, dtype=torch.int32)}
        if self.fedavg is not None:
            out.update(self.fedavg.setup(ctx), head_slices=head_slices(ctx.client.model, head))
        return out

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        head = linear_head(ctx.client.model)
        y = ctx.data.train.y
        counts = {"class_counts": torch.bincount(y.long(), minlength=ctx.info.num_classes)[:ctx.info.num_classes]
                  .to(torch.int32)}
        if self.fedavg is not None:  # the head travels inside the parameters
            return {**self.fedavg.upload(ctx), **counts}
        out = {"head_weight": head.weight.detach().float().clone()}
        if head.bias is not None:
            out["head_bias"] = head.bias.detach().float().clone()
        return {**out, **counts}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        if self.fedavg is not None and "parameters" in ctx.received:
            self.fedavg.receive(ctx)
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
    """FedGen (Zhu et al. 2021): the server trains G_w(z | y) against the clients' count-weighted heads;
    each client's loss gains alpha * CE(h(G(eps | y)), y); by default the server also averages the
    whole networks as FedAvg, the paper's setting (module docstring).

    Args:
        alpha: weight of the clients' generated-feature term (>= 0; with ``share: none``, 0 is local
            training).
        generated: generated features a client draws per round for its term (>= 1).
        noise_dim: width of the generator's noise input (>= 1).
        hidden: width of the generator's hidden layer (>= 1).
        generator_steps: the server's Adam steps on the generator per round (>= 1).
        generator_batch: (noise, label) draws per server step (>= 2: the diversity term compares pairs).
        generator_lr: the server's Adam learning rate (> 0).
        diversity: weight eta of the diversity term (>= 0).
        share: what the server shares besides G: ``parameters`` (FedAvg of the whole networks, the
            paper's setting; one architecture only), ``heads`` (the sample-weighted mean head, loaded
            by every client; HtFLlib's heterogeneous-model variant), ``none`` (heads stay local) or
            ``auto`` (the default: ``parameters`` when the clients' networks are equal, else
            ``heads`` with a warning).
    """

    short_name = "fedgen"
    label = "FedGen"
    exchange = "parameters"  # the parameter-exchange flow: uploads after the private phase, no public phase
    needs_public_set = False
    released = {"head_weight": "unbounded", "head_bias": "unbounded", "class_counts": "unbounded",
                "parameters": "unbounded"}

    def __init__(self, alpha: float = 1.0, generated: int = 64, noise_dim: int = 32, hidden: int = 64,
                 generator_steps: int = 100, generator_batch: int = 64, generator_lr: float = 0.005,
                 diversity: float = 1.0, share: str = "auto"):
        check_choice("aggregator.share", share, SHARES)
        self.share = share  # as configured; ``sharing``: what runs (auto resolved by check_config)
        self.use("parameters" if share == "auto" else share)
        self.slices: torch.Tensor | None = None  # share: parameters: where the head lies in the vector
        self.alpha = check_number("aggregator.alpha", alpha, minimum=0.0, inclusive=True)
        self.generated = count("aggregator.generated", generated, 1)
        self.noise_dim = count("aggregator.noise_dim", noise_dim, 1)
        self.hidden = count("aggregator.hidden", hidden, 1)
        self.generator_steps = count("aggregator.generator_steps", generator_steps, 1)
        self.generator_batch = count("aggregator.generator_batch", generator_batch, 2)
        self.generator_lr = check_number("aggregator.generator_lr", generator_lr, minimum=0.0, inclusive=False)
        self.diversity = check_number("aggregator.diversity", diversity, minimum=0.0, inclusive=True)
        self.generator: FeatureGenerator | None = None

    def use(self, sharing: str) -> None:
        self.sharing = sharing
        self.fedavg = FedAvg() if sharing == "parameters" else None  # the paper's setting: FedAvg besides G

    @property
    def measured_network(self) -> str:
        if self.sharing == "parameters":  # share: auto is resolved by check_config before any run
            return FedAvg.measured_network
        if self.sharing == "heads":
            return "each client's own network with the averaged head it loads"
        return "each client's own network"

    def check_config(self, model: Any, client: Any) -> None:
        if self.share == "auto":
            try:
                check_homogeneous(model, "FedGen (share: parameters)")
                self.use("parameters")
            except ConfigError:
                warnings.warn("FedGen (share: auto): the clients' networks differ, so whole networks cannot be "
                              "averaged; running HtFLlib's heterogeneous-model variant (share: heads)", stacklevel=2)
                self.use("heads")
        elif self.fedavg is not None:
            check_homogeneous(model, "FedGen (share: parameters)")

    def client_part(self) -> ClientPart:
        return FedGenClient(self.alpha, self.generated, self.noise_dim, self.hidden, self.sharing)

    # ------------------------------------------------------------------ server part
    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        """The generator, once every client's feature width D is known to agree (nothing goes down)."""
        widths = sorted({int(u["feature_width"]) for u in uploads})
        if len(widths) > 1:
            raise ConfigError("model", "FedGen's generator maps into one feature space, so every client's penultimate "
                              f"width (the input of its output layer) must agree; got widths {widths}")
        self.generator = self._build(ctx.info.num_classes, widths[0], ctx.info.seed)
        if self.fedavg is None:
            return {}
        slices = {tuple(u["head_slices"].tolist()) for u in uploads}
        if len(slices) > 1:
            raise ConfigError("model", "FedGen (share: parameters) reads the heads out of the averaged parameters, "
                              f"so every client's output layer must lie at one place; got {sorted(slices)}")
        self.slices = uploads[0]["head_slices"].cpu()
        return self.fedavg.server_setup(uploads, ctx)  # the initial model, down to every client

    def heads_in_parameters(self, uploads: Uploads, num_classes: int) -> Uploads:
        """share: parameters: each upload's head (and counts) read out of its parameter vector."""
        w, b = (int(x) for x in self.slices)
        d = self.generator.out.out_features
        out = []
        for u in uploads:
            flat = u["parameters"].float()
            head = {"head_weight": flat[w:w + num_classes * d].view(num_classes, d), "class_counts": u["class_counts"]}
            out.append({**head, "head_bias": flat[b:b + num_classes]} if b >= 0 else head)
        return out

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
        averaged = {}
        if self.fedavg is not None:
            averaged = {"parameters": self.fedavg.average(uploads, ctx)}
            uploads = self.heads_in_parameters(uploads, ctx.info.num_classes)
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
        broadcast = {"generator": flat, "label_counts": total.to(torch.int32), **averaged}
        if self.sharing == "heads":
            broadcast.update(global_head(weights, biases, counts, with_bias="head_bias" in uploads[0]))
        return AggregationResult(teacher=None, broadcast=broadcast, stats={"fedgen/generator_loss": float(ce.detach())})

    def state_dict(self) -> dict[str, Any]:
        if self.generator is None:
            return {}
        out = {"generator": {k: v.detach().cpu().clone() for k, v in self.generator.state_dict().items()},
               "feature_dim": self.generator.out.out_features, "num_classes": self.generator.num_classes}
        if self.fedavg is not None:
            out.update(fedavg=self.fedavg.state_dict(), head_slices=self.slices)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            self.generator = None
            return
        self.generator = self._build(state["num_classes"], state["feature_dim"], 0)  # weights: the saved ones
        self.generator.load_state_dict(state["generator"])
        if self.fedavg is not None:
            self.fedavg.load_state_dict(state["fedavg"])
            self.slices = state["head_slices"]
