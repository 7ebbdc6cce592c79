import numpy as np
import pytest
import torch

from fdlit.data import FederatedData
from fdlit.data.partition import assign_k_classes, block_k_classes, dirichlet_partition
from fdlit.errors import ConfigError


@pytest.mark.parametrize("m,k", [(10, 1), (10, 2), (5, 2), (20, 3), (7, 9), (3, 10)])
def test_k_classes_cover_every_class_and_each_client_has_k(m, k):
    sets = assign_k_classes(m, 10, k, np.random.default_rng(0))
    assert all(len(s) == k and len(set(s)) == k for s in sets)
    assert set().union(*map(set, sets)) == set(range(10))
    counts = np.bincount(np.concatenate(sets), minlength=10)
    assert counts.max() - counts.min() <= 1  # balanced


def test_k_classes_are_seeded():
    a = assign_k_classes(10, 10, 2, np.random.default_rng(1))
    assert a == assign_k_classes(10, 10, 2, np.random.default_rng(1))
    assert a != assign_k_classes(10, 10, 2, np.random.default_rng(2))


@pytest.mark.parametrize("k", [2, 5, 9])
def test_federated_splits_are_disjoint_and_clients_hold_their_classes(k):
    d = FederatedData(num_clients=10, classes_per_client=k, public_size=300).setup(0)
    test = set(d._test_source_index.tolist())
    pub = set(d._public_source_index.tolist())
    pool = set(d._pool_source_index.tolist())
    assert not pub & pool and not test & pool and not test & pub
    assert len(test) + len(pub) + len(pool) == 1797
    assert len(d.public) == 300
    for c in d.clients:
        assert len(c.classes) == k
        assert set(c.train.y.tolist()) <= set(c.classes) and set(c.calibration.y.tolist()) <= set(c.classes)
        # calibration never trained on: disjoint pool indices, about 20 %
        tr = set(torch.isin(torch.arange(len(d.pool)), torch.from_numpy(c.pool_index)).nonzero().flatten().tolist())
        assert len(tr) == len(c.train) + len(c.calibration)
        assert 0.15 < len(c.calibration) / (len(c.train) + len(c.calibration)) < 0.25
    held = set().union(*[set(c.classes) for c in d.clients])
    assert held == set(range(10))


def test_clients_sharing_a_class_may_share_samples():
    d = FederatedData(num_clients=10, classes_per_client=5).setup(0)
    overlaps = [len(set(a.pool_index) & set(b.pool_index)) for a in d.clients for b in d.clients if a is not b]
    assert max(overlaps) > 0


def test_samples_per_client_and_dirichlet():
    d = FederatedData(num_clients=5, classes_per_client=3, samples_per_client=100).setup(0)
    assert all(len(c.train) + len(c.calibration) == 100 for c in d.clients)
    parts = dirichlet_partition(np.repeat(np.arange(10), 50), 5, 0.1, np.random.default_rng(0))
    allidx = np.concatenate(parts)
    assert len(allidx) == len(set(allidx.tolist())) == 500  # disjoint and complete
    d = FederatedData(num_clients=5, partition="dirichlet", dirichlet_alpha=0.1).setup(0)
    assert max(len(c.classes) for c in d.clients) < 10 or min(len(c.classes) for c in d.clients) < 10


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"classes_per_client": 0}, "data.classes_per_client"),
        ({"classes_per_client": 11}, "data.classes_per_client"),
        ({"num_clients": 2, "classes_per_client": 2}, "data.classes_per_client"),  # 4 < 10 classes
        ({"calibration_fraction": 1.0}, "data.calibration_fraction"),
        ({"calibration_fraction": 0.0}, "data.calibration_fraction"),
        ({"samples_per_client": 10_000}, "data.samples_per_client"),
        ({"partition": "dirichlet", "num_clients": 500}, "data.num_clients"),
        ({"public_size": 5000}, "data.public_size"),
        ({"dataset": "imagenet"}, "data.dataset"),
    ],
)
def test_bad_data_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        FederatedData(**kwargs).setup(0)
    assert err.value.field == field


def test_class_coverage_is_checked_when_the_config_is_built():
    """num_clients x classes_per_client must cover the dataset's classes; checked in the constructor
    (a sweep's up-front check builds every config) for datasets whose class count is known."""

    with pytest.raises(ConfigError, match="3x2 < 10"):
        FederatedData(num_clients=3, classes_per_client=2)
    with pytest.raises(ConfigError, match="20x2 < 100"):
        FederatedData(dataset="cifar100", num_clients=20, classes_per_client=2)
    with pytest.raises(ConfigError, match=r"must be in \[1, 10\]"):
        FederatedData(num_clients=20, classes_per_client=11)
    FederatedData(num_clients=3, partition="dirichlet")  # no class assignment: nothing to cover
    FederatedData(dataset="cifar100", num_clients=20, classes_per_client=5)


def test_cyclic_assignment_gives_client_i_classes_i_to_i_plus_k_minus_1():
    data = FederatedData(num_clients=12, classes_per_client=3, class_assignment="cyclic", public_size=100).setup(0)
    assert [cd.classes for cd in data.clients[:3]] == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert data.clients[9].classes == [0, 1, 9]  # wraps around: 9, 10 mod 10, 11 mod 10
    for i, cd in enumerate(data.clients):
        assert cd.classes == sorted((i + j) % 10 for j in range(3))
        assert set(cd.train.y.tolist()) <= set(cd.classes)
    # the default stays the balanced random draw, which is not cyclic here
    random = FederatedData(num_clients=12, classes_per_client=3, public_size=100).setup(0)
    assert [cd.classes for cd in random.clients] != [cd.classes for cd in data.clients]


def test_cyclic_assignment_that_cannot_cover_every_class_is_refused():
    with pytest.raises(ConfigError, match="data.class_assignment"):
        FederatedData(num_clients=5, classes_per_client=2, class_assignment="cyclic")  # covers 6 of 10
    with pytest.raises(ConfigError, match="data.class_assignment"):
        FederatedData(class_assignment="round_robin")


def test_samples_per_client_under_dirichlet_is_refused_not_ignored():
    with pytest.raises(ConfigError, match=r"data\.samples_per_client.*max_train_samples"):
        FederatedData(num_clients=5, partition="dirichlet", samples_per_client=100)


@pytest.mark.parametrize("m,k", [(20, 2), (10, 5), (4, 5), (10, 1), (3, 10)])
def test_blocks_cut_a_permutation_into_disjoint_groups_each_held_by_m_k_over_c_clients(m, k):
    sets = block_k_classes(m, 10, k, np.random.default_rng(3))
    groups = {tuple(s) for s in sets}
    assert len(groups) == 10 // k and all(len(g) == k for g in groups)
    assert sorted(c for g in groups for c in g) == list(range(10))  # disjoint, and together every class
    assert all(sets.count(list(g)) == m * k // 10 for g in groups)
    assert all(sets[i] == sets[i % (10 // k)] for i in range(m))  # client i holds group i mod (C/k)


def test_blocks_are_seeded():
    a = block_k_classes(20, 10, 2, np.random.default_rng(1))
    assert a == block_k_classes(20, 10, 2, np.random.default_rng(1))
    assert a != block_k_classes(20, 10, 2, np.random.default_rng(2))


def test_blocks_assignment_in_a_federation_gives_clients_their_groups():
    data = FederatedData(num_clients=10, classes_per_client=2, class_assignment="blocks", public_size=100).setup(4)
    sets = [cd.classes for cd in data.clients]
    assert all(sets[i] == sets[i % 5] for i in range(10))
    assert sorted(c for s in sets[:5] for c in s) == list(range(10))
    for cd in data.clients:
        assert set(cd.train.y.tolist()) | set(cd.calibration.y.tolist()) == set(cd.classes)
    again = FederatedData(num_clients=10, classes_per_client=2, class_assignment="blocks", public_size=100).setup(4)
    assert [cd.classes for cd in again.clients] == sets
    assert [cd.pool_index.tolist() for cd in again.clients] == [cd.pool_index.tolist() for cd in data.clients]
    other = FederatedData(num_clients=10, classes_per_client=2, class_assignment="blocks", public_size=100).setup(5)
    assert [cd.classes for cd in other.clients] != sets


def test_blocks_that_do_not_divide_are_refused_before_any_data_loads():
    with pytest.raises(ConfigError) as err:
        FederatedData(num_clients=20, classes_per_client=3, class_assignment="blocks")
    assert err.value.field == "data.classes_per_client"
    assert "must divide 10; got 3" in str(err.value) and "blocks" in str(err.value)
    with pytest.raises(ConfigError) as err:
        FederatedData(num_clients=12, classes_per_client=2, class_assignment="blocks")
    assert err.value.field == "data.class_assignment"
    assert "5 class groups" in str(err.value) and "multiple of 5; got 12" in str(err.value)
    # cifar100 (known class count, never loaded here): 100 / 5 = 20 groups, 30 clients
    with pytest.raises(ConfigError, match="multiple of 20; got 30"):
        FederatedData(dataset="cifar100", num_clients=30, classes_per_client=5, class_assignment="blocks")
