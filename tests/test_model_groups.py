"""The model groups of configs/models/: each stacks on its dataset, every group builds on the dataset's
input shape with one penultimate width (what the prototype and head methods need) and different
architectures; a paired group (FML, FedKD) one shared network beside each of its group's; the HtFE8-like group assigns client i to architecture i mod 8, as HtFLlib does; the
narrow ResNet's and LeNet-5's width knobs, and a mixed federation running stacked by architecture."""

from pathlib import Path

import pytest
import torch
import yaml

from fdlit.clients.features import split_network
from fdlit.configuration.schema import parse_fit
from fdlit.errors import ConfigError
from fdlit.models import LeNet5, PerClient, ResNet18
from fdlit.models.build import build_model
from tests.paper_fixtures import idx_folder

MODELS = Path(__file__).resolve().parents[1] / "configs" / "models"
GROUPS = {  # group file: (the dataset it is for, its input shape, the shared width, distinct architectures)
    "digits_mixed.yaml": ("datasets/digits.yaml", (1, 8, 8), 128, 2),
    "fashion_mnist_mixed.yaml": ("datasets/fashion_mnist.yaml", (1, 28, 28), 64, 4),
    "htfe8.yaml": ("cifar10.yaml", (3, 32, 32), 512, 8),
}

PAIRED = {"fashion_mnist_mixed_mutual.yaml": "fashion_mnist_mixed.yaml"}  # FML/FedKD group: the group it pairs


def test_every_group_file_is_listed_here():
    assert sorted(p.name for p in MODELS.glob("*.yaml")) == sorted([*GROUPS, *PAIRED])


@pytest.mark.parametrize("name", sorted(PAIRED))
def test_a_paired_group_puts_one_shared_network_beside_each_network_of_its_group(name):
    """FML and FedKD average the shared network, so it must be one for all; the private networks are the
    paired group's, in its order and fractions, and each pair builds on the dataset's shape."""
    from fdlit.models.mutual import check_one_shared_network

    _, cfg = parse_fit(["--config", GROUPS[PAIRED[name]][0], "--config", "methods/fml.yaml", "--config", f"models/{name}"])
    assert cfg.model.class_path == "fdlit.models.PerClient"
    model = yaml.safe_load((MODELS / name).read_text())["model"]
    groups = model["init_args"]["groups"]
    paired = yaml.safe_load((MODELS / PAIRED[name]).read_text())["model"]["init_args"]["groups"]
    assert [g["class_path"] for g in groups] == ["fdlit.models.mutual.MutualPair"] * len(paired)
    assert [g["init_args"]["private"] for g in groups] == [{k: v for k, v in g.items() if k != "fraction"} for g in paired]
    assert [g["fraction"] for g in groups] == [g["fraction"] for g in paired]
    check_one_shared_network(model, "FML")
    other = {**groups[0], "init_args": {**groups[0]["init_args"], "shared": {"class_path": "fdlit.models.LeNet5"}}}
    with pytest.raises(ConfigError, match=r"^model.init_args.groups: FML averages the shared network"):
        check_one_shared_network({**model, "init_args": {"groups": [other, *groups[1:]]}}, "FML")
    shape = GROUPS[PAIRED[name]][1]
    for spec in groups:
        pair = build_model({k: v for k, v in spec.items() if k != "fraction"}, shape, 10)
        assert pair(torch.randn(2, *shape)).shape == (2, 10)


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_the_group_stacks_on_its_dataset_and_shares_one_feature_width(name):
    dataset, shape, width, kinds = GROUPS[name]
    _, cfg = parse_fit(["--config", dataset, "--config", f"models/{name}"])
    assert cfg.model.class_path == "fdlit.models.PerClient"
    groups = yaml.safe_load((MODELS / name).read_text())["model"]["init_args"]["groups"]
    assert [dict(g) for g in cfg.model.init_args.groups] == groups
    x = torch.randn(2, *shape)
    sizes = set()
    for spec in groups:
        spec = {k: v for k, v in spec.items() if k not in ("clients", "fraction")}
        net = build_model(spec, shape, 10).eval()
        features = net.embed(x)
        assert features.shape == (2, width), spec
        torch.testing.assert_close(net.classify(features), net(x))
        sizes.add(sum(p.numel() for p in net.parameters()))
    assert len(sizes) == kinds  # every group a different architecture


def test_htfe8_puts_client_i_on_architecture_i_mod_8_for_20_clients():
    groups = yaml.safe_load((MODELS / "htfe8.yaml").read_text())["model"]["init_args"]["groups"]
    specs = [repr(s) for s in PerClient.assign(groups, 20)]
    distinct = list(dict.fromkeys(specs))
    assert len(distinct) == 8 and all(specs[i] == distinct[i % 8] for i in range(20))


def test_the_resnets_width_and_blocks_and_lenets_feature_width():
    default = ResNet18((3, 32, 32), 10)
    assert sum(p.numel() for p in default.parameters()) == 11_173_962  # ResNet-18 as before
    narrow = ResNet18((1, 28, 28), 10, width=8, blocks=[1, 1, 1, 1])
    assert [len(getattr(narrow, f"layer{i}")) for i in range(1, 5)] == [1, 1, 1, 1]
    assert narrow.fc.in_features == 64 and narrow.layer4[0].conv1.out_channels == 64
    deep = ResNet18((3, 32, 32), 10, blocks=[3, 4, 6, 3])
    assert sum(p.numel() for p in deep.parameters()) == 21_282_122  # ResNet-34 (basic blocks)
    assert LeNet5((1, 28, 28), 10, feature_dim=32).classifier[-1].in_features == 32
    with pytest.raises(ConfigError, match=r"^model.init_args.blocks: four integers >= 1"):
        ResNet18(blocks=[2, 2, 2])
    with pytest.raises(ConfigError, match=r"^model.init_args.pretrained: ImageNet weights are ResNet-18's"):
        ResNet18(stem="imagenet", pretrained=True, width=32)
    with pytest.raises(ConfigError, match=r"^model.feature_dim: must be >= 1"):
        LeNet5(feature_dim=0)


def test_a_mixed_federation_trains_each_architecture_stacked_as_one_at_a_time(tmp_path):
    """The Fashion-MNIST group on tiny IDX files, FedGH, two clients per architecture: the vectorized
    executor stacks each architecture and ends where the sequential one does."""
    from fdlit.clients import ClientOptimization
    from fdlit.data import FederatedData
    from fdlit.execution import SequentialExecutor, VectorizedExecutor
    from fdlit.federation import FederationLoop
    from fdlit.methods import FedGH

    idx_folder(tmp_path, n_train=400, n_test=40)
    groups = yaml.safe_load((MODELS / "fashion_mnist_mixed.yaml").read_text())["model"]["init_args"]["groups"]
    spec = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": groups}}

    def fitted(executor):
        data = FederatedData(dataset="fashion_mnist", data_dir=str(tmp_path), num_clients=8, classes_per_client=4,
                             samples_per_client=30, public_size=0)
        loop = FederationLoop(rounds=2, private_epochs_first=1, private_epochs=1, public_epochs_first=0,
                              public_epochs=0, data=data, model=spec, aggregator=FedGH(server_epochs=2),
                              client=ClientOptimization(optimizer="adam", lr=0.01, batch_size=16), executor=executor)
        loop.fit()
        return loop

    seq, vec = fitted(SequentialExecutor()), fitted(VectorizedExecutor())
    assert vec.settings.executor.trained == {"vectorized": 8 * 2, "sequential": 0}
    assert len({type(split_network(c.model)[1]).__name__ for c in vec.view.clients}) == 4
    for a, b in zip(seq.view.clients, vec.view.clients, strict=True):
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            # grouped convolutions sum in another order, and a last-bit difference that moves one activation
            # across a ReLU kink, or one of Adam's normalised steps, grows to a few 1e-3 in single weights; the
            # bound leaves 5x over the worst measured (4.2e-3 in one weight, 2.1e-4 on average in one layer,
            # the size varying with the thread count), a client trained as another's network is ~1e-1 apart
            torch.testing.assert_close(p, q, rtol=0.0, atol=2e-2)
            assert float((p - q).detach().abs().mean()) < 1e-3
