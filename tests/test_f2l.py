"""F2L's hierarchy (Nguyen et al. 2022) in FD: regions, LKD within a region, aggregation across regions."""

import pytest
import torch

from fdlit.errors import ConfigError
from fdlit.methods import F2L, LKD
from fdlit.methods.base import context_for


def uploads(m=6, n=40, c=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"logits": 3 * torch.randn(n, c, generator=g), "class_auc": torch.rand(c, generator=g)} for _ in range(m)]


def test_one_region_is_lkd_and_one_client_per_region_is_lkd_across_clients():
    up = uploads()
    flat = LKD().aggregate(up, context_for(up))
    for agg in (F2L(regions=1), F2L(regions=6), F2L(regions=[0, 1, 2, 3, 4, 5])):
        res = agg.aggregate(up, context_for(up))
        torch.testing.assert_close(res.teacher, flat.teacher)
        torch.testing.assert_close(res.weights, flat.weights)


def test_the_global_teacher_is_lkd_over_regional_lkd_teachers():
    up = uploads()
    assignment = [0, 1, 0, 2, 1, 0]
    res = F2L(regions=assignment).aggregate(up, context_for(up))
    lkd = LKD()
    regional = []
    for r in range(3):
        members = [up[i] for i in range(6) if assignment[i] == r]
        teacher = lkd.aggregate(members, context_for(members)).teacher  # LKD within the region
        auc = torch.stack([u["class_auc"] for u in members])
        beta = torch.softmax(20.0 * auc, 0)
        regional.append({"logits": teacher.log(), "class_auc": (beta * auc).sum(0)})
    expected = lkd.aggregate(regional, context_for(regional))  # LKD across the regional teachers
    torch.testing.assert_close(res.teacher, expected.teacher)
    torch.testing.assert_close(res.weights.sum(0), torch.ones(40))
    # the hierarchy is not flat LKD
    assert not torch.allclose(res.teacher, lkd.aggregate(up, context_for(up)).teacher, atol=1e-3)


def test_across_avg_weighs_each_region_by_its_size():
    up = uploads(m=4)
    res = F2L(regions=[0, 0, 0, 1], across="avg").aggregate(up, context_for(up))
    torch.testing.assert_close(res.weights[3], torch.full((40,), 0.25))  # alone in its region
    torch.testing.assert_close(res.weights[:3].sum(0), torch.full((40,), 0.75))


def test_bytes_per_tier():
    up = [{"logits": u["logits"].half(), "class_auc": u["class_auc"]} for u in uploads(m=6, n=40, c=5)]
    stats = F2L(regions=3).aggregate(up, context_for(up)).stats
    assert stats["f2l/bytes_client_to_region"] == 6 * (40 * 5 * 2 + 5 * 4)
    assert stats["f2l/bytes_region_to_global"] == 3 * (40 * 5 * 2 + 5 * 4)
    assert stats["f2l/bytes_global_to_region"] == 3 * 40 * 5 * 2


@pytest.mark.parametrize("kwargs", [{"regions": 0}, {"regions": [0, 2]}, {"regions": []}, {"across": "max"}])
def test_bad_regions_name_their_field(kwargs):
    with pytest.raises(ConfigError, match=r"aggregator\.(regions|across)"):
        F2L(**kwargs)


def test_regions_that_do_not_fit_the_federation_are_refused():
    with pytest.raises(ConfigError, match=r"aggregator\.regions"):
        F2L(regions=5).assignment(4)
    with pytest.raises(ConfigError, match=r"aggregator\.regions"):
        F2L(regions=[0, 1, 1]).assignment(4)


def tiny(aggregator):
    from fdlit.data import FederatedData
    from fdlit.federation import FederationLoop

    return FederationLoop(
        rounds=1, private_epochs_first=1, private_epochs=1, public_epochs_first=1, public_epochs=1,
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=120),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}}, aggregator=aggregator,
    )


def test_a_fit_counts_the_client_tier_as_the_ledger_does_and_bad_regions_stop_it_before_round_1():
    loop = tiny(F2L(regions=[0, 1, 1, 0]))
    loop.fit()
    (m,) = loop.history
    assert m["f2l/bytes_client_to_region"] == m["comm/up_bytes"] > 0
    assert m["f2l/bytes_global_to_region"] == 2 * 120 * 10 * loop.settings.message_dtype.itemsize
    with pytest.raises(ConfigError, match=r"aggregator\.regions.*5 regions for 4 clients"):
        tiny(F2L(regions=5))  # refused when the loop is built, before any data loads
