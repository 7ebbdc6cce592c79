"""LG-FedAvg (Liang et al. 2020): the server's n_k-weighted head average by hand (all clients, a sampled
subset, and from secure sums), a client's head vector and its loading, and the messages of a run."""

import math

import pytest
import torch

from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import SequentialExecutor
from fdlit.federation import FederationLoop
from fdlit.methods import LGFedAvg
from fdlit.methods.base import FederationInfo, ServerContext
from fdlit.methods.lg_fedavg import head_vector, load_head
from fdlit.models import MLP
from fdlit.privacy.secure_upload import SecureSums

C, D = 3, 2


def context(clients=()):
    info = FederationInfo(round=1, seed=0, num_clients=3, num_classes=C, public_x=torch.zeros(0, 1), clients=clients)
    return ServerContext(info)


def set_up(counts):
    method = LGFedAvg()
    uploads = [{"num_samples": torch.tensor(n), "feature_width": torch.tensor(D, dtype=torch.int32)} for n in counts]
    uploads[0]["initial_head"] = torch.arange(C * D + C, dtype=torch.float32)
    sent = method.server_setup(uploads, context())
    return method, sent


def test_the_server_averages_the_heads_weighted_by_the_clients_sample_counts():
    method, sent = set_up([1, 2, 5])
    assert torch.equal(sent["head"], torch.arange(C * D + C, dtype=torch.float32))  # client 0's head, to every client
    heads = [torch.tensor([1.0, 0, 0, 0, 0, 0, 1, 1, 1]), torch.tensor([0.0, 2, 0, 0, 0, 0, 2, 2, 2]),
             torch.tensor([0.0, 0, 4, 0, 0, 0, 8, 8, 8])]
    out = method.aggregate([{"head": h} for h in heads], context()).broadcast["head"]
    # (1 * h0 + 2 * h1 + 5 * h2) / 8, written out entry by entry
    expected = torch.tensor([1 / 8, 4 / 8, 20 / 8, 0, 0, 0, (1 + 4 + 40) / 8, (1 + 4 + 40) / 8, (1 + 4 + 40) / 8])
    torch.testing.assert_close(out, expected)
    # under client sampling only the arrived clients count: clients 0 and 2, n = 1 + 5
    sampled = method.aggregate([{"head": heads[0]}, {"head": heads[2]}], context((0, 2))).broadcast["head"]
    torch.testing.assert_close(sampled, torch.tensor([1 / 6, 0, 20 / 6, 0, 0, 0, 41 / 6, 41 / 6, 41 / 6]))


def test_secure_sums_give_the_same_average():
    method, _ = set_up([1, 2, 5])
    g = torch.Generator().manual_seed(0)
    heads = [torch.randn(C * D + C, generator=g) for _ in range(3)]
    terms = [method.secure_summands({"head": h}, k) for k, h in enumerate(heads)]
    sums = {name: sum(t[name][0] for t in terms) for name in ("weighted", "weight")}
    assert all(t["weight"][0].item() <= 1 for t in terms)  # w_k = n_k / max n_j
    out = method.aggregate_sums(SecureSums(sums, (0, 1, 2)), context()).broadcast["head"]
    torch.testing.assert_close(out, method.aggregate([{"head": h} for h in heads], context()).broadcast["head"])


def test_different_widths_are_refused_at_set_up():
    uploads = [{"num_samples": torch.tensor(3), "feature_width": torch.tensor(w, dtype=torch.int32)} for w in (16, 32)]
    uploads[0]["initial_head"] = torch.zeros(10 * 16 + 10)
    with pytest.raises(ConfigError, match=r"^model: LG-FedAvg exchanges .* got widths \[16, 32\]$"):
        LGFedAvg().server_setup(uploads, context())


def test_a_clients_head_vector_is_its_output_layer_and_loads_back():
    net = MLP((1, 8, 8), 10, hidden=[16])
    vec = head_vector(net, "LG-FedAvg")
    out = net.net[-1]
    assert torch.equal(vec, torch.cat([out.weight.reshape(-1), out.bias]).detach()) and vec.numel() == 10 * 16 + 10
    hidden_before = net.net[1].weight.detach().clone()
    load_head(net, torch.arange(vec.numel(), dtype=torch.float32), "LG-FedAvg")
    assert torch.equal(out.weight.detach().reshape(-1), torch.arange(160, dtype=torch.float32))
    assert torch.equal(out.bias.detach(), torch.arange(160, 170, dtype=torch.float32))
    assert torch.equal(net.net[1].weight, hidden_before)  # the feature extractor stays the client's own


def test_a_round_sends_heads_only_and_every_client_holds_the_average():
    loop = FederationLoop(
        rounds=2, private_epochs_first=1, private_epochs=1, public_epochs_first=0, public_epochs=0,
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=0),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [D * 8]}},
        client=ClientOptimization(optimizer="adam", lr=0.01, batch_size=32), aggregator=LGFedAvg(),
        executor=SequentialExecutor())
    loop.fit()
    ledger, p = loop.server_side.ledger, 10 * 16 + 10
    assert ledger.total("up", round=0) == 4 * (8 + 4) + p * 4  # n_k, D from each; client 0's head
    assert ledger.total("down", round=0) == 4 * p * 4
    for r in (1, 2):
        assert ledger.total("up", round=r) == ledger.total("down", round=r) == 4 * p * 4
    heads = [head_vector(c.model, "LG-FedAvg") for c in loop.view.clients]
    assert all(torch.equal(h, heads[0]) for h in heads)  # every client loaded the same averaged head
    hidden = [c.model.net[1].weight for c in loop.view.clients]
    assert not torch.equal(hidden[0], hidden[1])  # while the extractors stay their own
    assert math.isfinite(loop.history[-1]["after_private/global_acc_mean"])
