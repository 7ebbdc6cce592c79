"""FedGen's pieces that are not hooks: the conditional feature generator, its diversity term, the
ensemble of the clients' linear heads, a client's output layer, and the seeded draws.

The generator G_w(z | y) maps Gaussian noise eps (``noise_dim``) and a one-hot label to a point of
the clients' feature space (the input of their output layer, width D):
``Linear(noise_dim + C, hidden) -> ReLU -> Linear(hidden, D)``. The server trains it as a module;
a client runs it from the flat weights it received (:func:`generate`), which builds no module and
so draws nothing from the global random stream.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fdlit.clients.features import has_feature_split, split_network
from fdlit.errors import ConfigError


class FeatureGenerator(nn.Module):
    """G_w(z | y): noise and a label -> a D-dimensional feature (module docstring)."""

    def __init__(self, noise_dim: int, num_classes: int, hidden: int, feature_dim: int):
        super().__init__()
        self.num_classes = num_classes
        self.hidden = nn.Linear(noise_dim + num_classes, hidden)
        self.out = nn.Linear(hidden, feature_dim)

    def forward(self, eps: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(labels.long(), self.num_classes).to(eps.dtype)
        return self.out(torch.relu(self.hidden(torch.cat([eps, onehot], 1))))


def generator_shapes(noise_dim: int, num_classes: int, hidden: int, feature_dim: int) -> list[tuple[int, ...]]:
    """The shapes of the generator's parameters, in ``parameters()`` order (the flat message's order)."""
    return [(hidden, noise_dim + num_classes), (hidden,), (feature_dim, hidden), (feature_dim,)]


def generate(flat: torch.Tensor, eps: torch.Tensor, labels: torch.Tensor, num_classes: int, hidden: int,
             feature_dim: int) -> torch.Tensor:
    """G(eps | labels) computed from the generator's flat weights, as :class:`FeatureGenerator` does."""
    shapes = generator_shapes(eps.shape[1], num_classes, hidden, feature_dim)
    sizes = [int(np.prod(s)) for s in shapes]
    if flat.numel() != sum(sizes):
        raise ConfigError("aggregator", f"FedGen received a generator of {flat.numel()} numbers; one of noise "
                          f"{eps.shape[1]}, hidden {hidden} and feature width {feature_dim} holds {sum(sizes)} "
                          "(every client's penultimate width must agree)")
    w1, b1, w2, b2 = (t.reshape(s) for t, s in zip(flat.split(sizes), shapes, strict=True))
    onehot = F.one_hot(labels.long(), num_classes).to(eps.dtype)
    return F.linear(torch.relu(F.linear(torch.cat([eps, onehot], 1), w1, b1)), w2, b2)


def diversity_loss(eps: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """exp(-mean_{i,j} d_eps(i, j) d_z(i, j)): d_eps the mean squared difference of two noise draws,
    d_z the mean absolute difference of their features; small when different noise gives different
    features (the diversity term of the authors' FedGen code)."""
    d_eps = (eps[:, None] - eps[None]).pow(2).mean(-1)
    d_z = (features[:, None] - features[None]).abs().mean(-1)
    return torch.exp(-(d_eps * d_z).mean())


def ensemble_logits(features: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, biases: torch.Tensor,
                    mix: torch.Tensor) -> torch.Tensor:
    """sum_k mix[k, y_b] (W_k z_b + b_k) for every row b: the clients' heads (``weights`` K x C x D,
    ``biases`` K x C) weighted per class by ``mix`` (K x C, columns summing to 1 over holders)."""
    per_head = torch.einsum("bd,kcd->kbc", features, weights) + biases[:, None, :]
    return (mix[:, labels.long()][..., None] * per_head).sum(0)


def linear_head(model: nn.Module, method: str = "FedGen") -> nn.Linear:
    """The client network's output layer: the one ``nn.Linear`` its ``classify`` runs. Anything else
    (no embed/classify split, a deeper head, a head that is not linear) is refused naming ``model``
    and ``method``, the method that exchanges the layer."""
    _, net = split_network(model)
    name = type(net).__name__
    if not has_feature_split(net):
        raise ConfigError("model", f"{method} exchanges each client's output layer and reads its "
                          "penultimate features, so the network must provide embed(x) -> B x D features and "
                          f"classify(features) -> logits with forward(x) == classify(embed(x)); {name} does not")
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    head = linears[-1] if linears else None
    ran: list[nn.Module] = []
    same = False
    if head is not None:
        hooks = [m.register_forward_hook(lambda m, i, o: ran.append(m)) for m in net.modules() if m is not net]
        try:
            probe = torch.randn(3, head.in_features, generator=torch.Generator().manual_seed(0))
            probe = probe.to(device=head.weight.device, dtype=head.weight.dtype)
            with torch.no_grad():
                same = torch.allclose(net.classify(probe), head(probe))
        except RuntimeError:  # classify takes another width than the last linear layer's: a deeper head
            same = False
        finally:
            for h in hooks:
                h.remove()
    if head is None or not same or any(m is not head for m in ran):
        raise ConfigError("model", f"{method} exchanges the output layer, so {name}.classify must be one "
                          "torch.nn.Linear layer (features -> logits); it is not")
    return head


def seeded(*keys: int) -> torch.Generator:
    """A CPU generator of its own for (run seed, round, ...): the draws of a round are the same under
    every executor and after a resume, and no other random stream moves."""
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)[0] >> 1
    return torch.Generator().manual_seed(int(state))


def draw(counts: torch.Tensor, n: int, noise_dim: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels y ~ counts / sum(counts), noise eps ~ N(0, I)): n of each, on the CPU."""
    labels = torch.multinomial(counts.float().cpu(), n, replacement=True, generator=generator)
    return labels, torch.randn(n, noise_dim, generator=generator)
