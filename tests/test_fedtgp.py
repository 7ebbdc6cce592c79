"""FedTGP (Zhang et al. 2024): the adaptive margin and the margin-enhanced contrastive loss by hand, one
server SGD step on the trainable global prototypes against the loss written out, the prototypes a
client is regularised towards, and the refusals before round 1."""

import math

import pytest
import torch

from fdlit.clients.loss_context import LossContext
from fdlit.errors import ConfigError
from fdlit.methods import FedTGP
from fdlit.methods.base import FederationInfo, ServerContext
from fdlit.methods.fedtgp import (
    TGP_KEYS,
    adaptive_margin,
    global_prototypes,
    margin_contrastive_loss,
)

C, D = 3, 2
# client 0 holds classes 0 and 1, client 1 classes 0 and 2
UPLOADS = [
    {"prototypes": torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 0.0]]), "class_counts": torch.tensor([5, 2, 0])},
    {"prototypes": torch.tensor([[0.0, 2.0], [0.0, 0.0], [0.0, 10.0]]), "class_counts": torch.tensor([1, 0, 4])},
]


def context(round=1):
    return ServerContext(FederationInfo(round=round, seed=0, num_clients=2, num_classes=C, public_x=torch.zeros(0, 1)))


def test_the_adaptive_margin_is_the_largest_nearest_class_distance_capped_by_tau():
    protos = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 10.0]])
    labels = torch.tensor([0, 1, 0, 2])
    # class means (plain, over the clients): c0 (0, 1), c1 (3, 0), c2 (0, 10); nearest other class:
    # c0 -> c1 at sqrt(10), c1 -> c0 at sqrt(10), c2 -> c0 at 9; the largest of these is 9
    assert adaptive_margin(protos, labels, C, 100.0) == pytest.approx(9.0)
    assert adaptive_margin(protos, labels, C, 5.0) == 5.0
    assert adaptive_margin(protos[:1], labels[:1], C, 7.0) == 7.0  # one class: tau
    assert adaptive_margin(protos[[0, 1]], labels[[0, 1]], C, 100.0) == pytest.approx(3.0)


def test_the_contrastive_loss_is_the_cross_entropy_of_negative_distances_with_the_margin_written_out():
    g = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])  # G(0), G(1), G(2)
    p = torch.tensor([[0.0, 1.0], [4.0, 0.0]])
    y = torch.tensor([2, 1])
    margin = 0.5
    total = 0.0
    for row, label in zip(p.tolist(), y.tolist(), strict=True):
        d = [math.dist(row, gc) + (margin if c == label else 0.0) for c, gc in enumerate(g.tolist())]
        total += -(-d[label] - math.log(sum(math.exp(-v) for v in d)))
    assert margin_contrastive_loss(p, y, g, margin).item() == pytest.approx(total / 2, rel=1e-6)


def loss_written_out(tgp, protos, labels, margin):
    """The server's loss from its formula: G(c) = W2 relu(W1 e_c + b1) + b2, CE of -(d + delta 1[c = y])."""
    rows = []
    for p, y in zip(protos, labels, strict=True):
        logits = []
        for c in range(C):
            hidden = torch.relu(tgp["hidden_weight"] @ tgp["embedding"][c] + tgp["hidden_bias"])
            gc = tgp["out_weight"] @ hidden + tgp["out_bias"]
            logits.append(-(torch.sqrt(((p - gc) ** 2).sum()) + (margin if c == int(y) else 0.0)))
        logits = torch.stack(logits)
        rows.append(torch.logsumexp(logits, 0) - logits[int(y)])
    return torch.stack(rows).mean()


def test_one_server_epoch_is_one_sgd_step_on_the_written_out_loss():
    lr = 0.05
    method = FedTGP(server_epochs=1, server_lr=lr, server_batch_size=10)  # the four pairs in one batch
    assert method.server_setup([{"feature_width": torch.tensor(D, dtype=torch.int32)}] * 2, context(0)) == {}
    before = {k: v.clone().requires_grad_() for k, v in method.tgp.items()}
    out = method.aggregate(UPLOADS, context())
    protos = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 10.0]])
    labels = torch.tensor([0, 1, 0, 2])
    loss = loss_written_out(before, protos, labels, 9.0)  # the margin of the test above
    grads = torch.autograd.grad(loss, [before[k] for k in TGP_KEYS])
    stepped = {k: (before[k] - lr * gk).detach() for k, gk in zip(TGP_KEYS, grads, strict=True)}
    for k in TGP_KEYS:
        torch.testing.assert_close(method.tgp[k], stepped[k])
    torch.testing.assert_close(out.broadcast["global_prototypes"], global_prototypes(stepped))
    assert out.broadcast.keys() == {"global_prototypes"} and out.broadcast["global_prototypes"].shape == (C, D)
    assert out.stats["fedtgp/margin"] == pytest.approx(9.0)
    assert out.stats["fedtgp/server_loss"] == pytest.approx(loss.item(), rel=1e-5)


def test_training_separates_the_global_prototypes_towards_their_classes():
    method = FedTGP(server_epochs=300, server_lr=0.05)
    method.server_setup([{"feature_width": torch.tensor(D, dtype=torch.int32)}] * 2, context(0))
    protos = method.aggregate(UPLOADS, context()).broadcast["global_prototypes"]
    means = torch.tensor([[0.0, 1.0], [3.0, 0.0], [0.0, 10.0]])
    assert (torch.cdist(means, protos).argmin(1) == torch.arange(C)).all()  # each class mean nearest its own G(c)


def test_the_client_is_pulled_towards_every_classs_global_prototype():
    part = FedTGP(lam=2.0).client_part()
    state = {"proto_global": torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 0.0]]), "proto_known": torch.ones(C)}
    features = torch.tensor([[0.0, 0.0], [1.0, 1.0]], requires_grad=True)
    logits, y = torch.zeros(2, C), torch.tensor([2, 0])
    base = torch.nn.functional.cross_entropy(logits, y)
    loss = part.loss(LossContext(None, "private", logits, y, base, state, features=features))
    # lambda * mean over rows of ||f - G(y)||^2 / D: row 0 (4 + 0) / 2, row 1 0
    torch.testing.assert_close(loss, base + 2.0 * (2.0 + 0.0) / 2)


def test_settings_and_widths_are_checked_in_one_line():
    with pytest.raises(ConfigError, match=r"^aggregator.margin_threshold:"):
        FedTGP(margin_threshold=-1.0)
    with pytest.raises(ConfigError, match=r"^aggregator.server_epochs: must be >= 1, got 0"):
        FedTGP(server_epochs=0)
    widths = [{"feature_width": torch.tensor(w, dtype=torch.int32)} for w in (16, 32)]
    with pytest.raises(ConfigError, match=r"^model: FedTGP exchanges .* got widths \[16, 32\]$"):
        FedTGP().server_setup(widths, context(0))
