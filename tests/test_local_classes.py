"""Local classes under Dirichlet partitions: a class counts as local to a client only when the client
holds at least ``data.local_class_min_samples`` private samples of it."""

import numpy as np
import pytest
import torch

from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.federation import FederationLoop
from fdlit.methods import Oracle


def test_a_single_sample_of_a_class_no_longer_makes_it_local():
    d = FederatedData(num_clients=5, partition="dirichlet")
    labels = np.array([0] * 12 + [3] * 5 + [7])  # one stray sample of class 7
    assert d.local_classes(labels) == [0, 3]
    assert FederatedData(num_clients=5, partition="dirichlet", local_class_min_samples=1).local_classes(labels) == [0, 3, 7]
    assert FederatedData(num_clients=5, partition="dirichlet", local_class_min_samples=6).local_classes(labels) == [0]
    # nothing above the threshold: the most frequent class(es) stay local, never an empty set
    assert FederatedData(num_clients=5, partition="dirichlet", local_class_min_samples=50).local_classes(labels) == [0]
    # the k-classes partition: the assigned classes, whatever the counts
    assert FederatedData(num_clients=5).local_classes(labels) == [0, 3, 7]


def test_bad_threshold_names_the_field():
    with pytest.raises(ConfigError, match="data.local_class_min_samples"):
        FederatedData(partition="dirichlet", local_class_min_samples=0)


def find_singletons(d: FederatedData) -> list[tuple[int, int]]:
    out = []
    for c in d.clients:
        values, counts = np.unique(d.pool.y.numpy()[c.pool_index], return_counts=True)
        out += [(c.client_id, int(v)) for v, n in zip(values, counts, strict=True) if n == 1]
    return out


def test_dirichlet_clients_local_accuracy_and_the_oracle_follow_the_threshold():
    kw = dict(num_clients=8, partition="dirichlet", dirichlet_alpha=0.1, public_size=200)
    strict = FederatedData(**kw, local_class_min_samples=3).setup(0)
    loose = FederatedData(**kw, local_class_min_samples=1).setup(0)
    singles = find_singletons(loose)
    assert singles, "the seed must give some client a single sample of a class"
    for cid, cls in singles:
        assert cls in loose.clients[cid].classes and cls not in strict.clients[cid].classes
    for c in strict.clients:  # the same partition, a stricter class set
        counts = np.bincount(strict.pool.y.numpy()[c.pool_index], minlength=10)
        assert all(counts[k] >= 3 for k in c.classes) or len(c.classes) == 1
        assert np.array_equal(c.pool_index, loose.clients[c.client_id].pool_index)

    loop = FederationLoop(rounds=1, private_epochs_first=0, public_epochs_first=0, data=strict,
                          model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [8]}},
                          aggregator=Oracle())
    loop.setup()
    cid, cls = singles[0]
    # local accuracy counts no test sample of the stray class; the client (UWA's components, LKD)
    # and the server's class sets (the Oracle) see the strict set
    on_stray = loop.parts.tensors.test_y == cls
    assert loop.parts.tensors.local_masks[cid][on_stray].sum() == 0
    assert loop.view.clients[cid].classes == strict.clients[cid].classes
    ctx = loop.parts.facts.server_context(0)
    assert ctx.client_classes[cid] == tuple(strict.clients[cid].classes) and cls not in ctx.client_classes[cid]
    oracle = loop.server_side.method
    oracle.server_setup([], ctx)
    assert not oracle.holds[cid][loop.parts.tensors.public_y == cls].any()
    assert torch.equal(loop.parts.tensors.local_masks[cid].bool(), torch.isin(loop.parts.tensors.test_y, torch.tensor(strict.clients[cid].classes)))
