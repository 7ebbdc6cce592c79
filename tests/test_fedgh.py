"""FedGH (Yi et al. 2023): the server's head training by hand (one full-batch SGD step of the mean
cross-entropy on the held classes' representations), the pairs it trains on, its seeded mini-batch
order, and what a client uploads and loads."""

import pytest
import torch

from fdlit.errors import ConfigError
from fdlit.methods import FedGH
from fdlit.methods.base import FederationInfo, ServerContext
from fdlit.methods.fedgh import labelled_prototypes

C, D = 3, 2


def context(round=1, seed=0):
    return ServerContext(FederationInfo(round=round, seed=seed, num_clients=2, num_classes=C,
                                        public_x=torch.zeros(0, 1)))


def set_up(method, weight, bias):
    uploads = [{"feature_width": torch.tensor(D, dtype=torch.int32)} for _ in range(2)]
    uploads[0]["initial_head"] = torch.cat([weight.reshape(-1), bias])
    return method.server_setup(uploads, context(round=0))


UPLOADS = [  # client 0 holds classes 0 and 1, client 1 holds class 2 (its other rows are zeros, not sent as pairs)
    {"prototypes": torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]]), "class_counts": torch.tensor([4, 1, 0])},
    {"prototypes": torch.tensor([[0.0, 0.0], [0.0, 0.0], [-1.0, -1.0]]), "class_counts": torch.tensor([0, 0, 7])},
]


def test_the_pairs_are_the_held_classes_representations():
    protos, labels = labelled_prototypes(UPLOADS)
    assert labels.tolist() == [0, 1, 2]
    assert protos.tolist() == [[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]]


def test_one_server_epoch_is_one_sgd_step_of_the_mean_cross_entropy_written_out():
    weight = torch.tensor([[0.5, -0.5], [0.0, 1.0], [1.0, 1.0]])
    bias = torch.tensor([0.1, 0.0, -0.1])
    lr = 0.3
    method = FedGH(server_epochs=1, server_lr=lr, server_batch_size=10)  # one batch holds all three pairs
    assert torch.equal(set_up(method, weight, bias)["head"], torch.cat([weight.reshape(-1), bias]))
    out = method.aggregate(UPLOADS, context()).broadcast["head"]
    # by hand: z = W r + b, p = softmax(z), dL/dW = (1/P) sum (p - e_y) r^T, dL/db = (1/P) sum (p - e_y)
    r = [[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]]
    y = [0, 1, 2]
    grad_w = [[0.0] * D for _ in range(C)]
    grad_b = [0.0] * C
    for row, label in zip(r, y, strict=True):
        z = [sum(weight[c, j].item() * row[j] for j in range(D)) + bias[c].item() for c in range(C)]
        e = [torch.tensor(v).exp().item() for v in z]
        p = [v / sum(e) for v in e]
        for c in range(C):
            delta = p[c] - (1.0 if c == label else 0.0)
            grad_b[c] += delta / 3
            for j in range(D):
                grad_w[c][j] += delta * row[j] / 3
    expected_w = weight - lr * torch.tensor(grad_w)
    expected_b = bias - lr * torch.tensor(grad_b)
    torch.testing.assert_close(out, torch.cat([expected_w.reshape(-1), expected_b]))
    torch.testing.assert_close(method.weight, expected_w)  # the server keeps the head it sent


def test_mini_batches_follow_the_seeded_order_and_the_next_round_starts_from_the_trained_head():
    weight, bias = torch.zeros(C, D), torch.zeros(C)

    def trained(seed, round):
        method = FedGH(server_epochs=2, server_lr=0.5, server_batch_size=1)
        set_up(method, weight, bias)
        return method.aggregate(UPLOADS, context(round, seed)).broadcast["head"], method

    a, method = trained(0, 1)
    assert torch.equal(a, trained(0, 1)[0])  # the same (seed, round): the same head
    assert not torch.equal(a, trained(0, 2)[0]) or not torch.equal(a, trained(1, 1)[0])  # the order is drawn
    again = method.aggregate(UPLOADS, context(2)).broadcast["head"]
    fresh = FedGH(server_epochs=2, server_lr=0.5, server_batch_size=1)
    set_up(fresh, a[:C * D].view(C, D), a[C * D:])
    torch.testing.assert_close(again, fresh.aggregate(UPLOADS, context(2)).broadcast["head"])


def test_settings_are_checked_in_one_line():
    with pytest.raises(ConfigError, match=r"^aggregator.server_epochs: must be >= 1, got 0$"):
        FedGH(server_epochs=0)
    with pytest.raises(ConfigError, match=r"^aggregator.server_lr:"):
        FedGH(server_lr=0.0)
    with pytest.raises(ConfigError, match=r"^aggregator.server_batch_size: must be an integer >= 1"):
        FedGH(server_batch_size=1.5)
