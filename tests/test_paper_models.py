"""Paper models on CPU without network: ResNet-18 (CIFAR stem, ImageNet weights from a local file),
LeNet-5, BERT-tiny's wrapper on a tiny local BERT, heterogeneous per-client networks."""

import paper_fixtures  # noqa: F401  (offline HF env first)
import pytest
import torch
from paper_fixtures import local_bert

from fdlit.errors import ConfigError
from fdlit.models import LeNet5, PerClient, ResNet18
from fdlit.models.build import build_model
from fdlit.models.resnet import WeightsUnavailable


def test_resnet18_cifar_form():
    torch.manual_seed(0)
    net = ResNet18((3, 32, 32), 10)
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, torch.nn.Identity)
    assert sum(p.numel() for p in net.parameters()) == 11_173_962  # ResNet-18 with a 10-way head
    net.eval()
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_resnet18_imagenet_weights_from_a_local_file(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(1)
    source = ResNet18((3, 224, 224), 1000, stem="imagenet")  # torchvision names, 1000-way fc
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, str(tmp_path / "resnet18.safetensors"))
    torch.save(state, tmp_path / "resnet18.pth")
    for path in ("resnet18.safetensors", "resnet18.pth"):
        net = ResNet18((3, 32, 32), 100, stem="imagenet", pretrained=True, weights_path=str(tmp_path / path))
        assert net.conv1.kernel_size == (7, 7) and isinstance(net.maxpool, torch.nn.MaxPool2d)
        assert torch.equal(net.layer3[1].conv2.weight, state["layer3.1.conv2.weight"])
        assert torch.equal(net.bn1.running_var, state["bn1.running_var"])
        assert net.fc.out_features == 100  # fresh head for CIFAR-100
        net.eval()
        assert net(torch.randn(2, 3, 32, 32)).shape == (2, 100)


def test_resnet18_pretrained_offline_not_cached_says_how_to_fetch():
    with pytest.raises(WeightsUnavailable) as err:
        ResNet18((3, 32, 32), 100, stem="imagenet", pretrained=True)
    assert "hf download timm/resnet18.tv_in1k" in str(err.value) and "--model.weights_path" in str(err.value)


def test_resnet18_pretrained_needs_imagenet_stem():
    with pytest.raises(ConfigError, match="model.init_args.pretrained"):
        ResNet18((3, 32, 32), 10, stem="cifar", pretrained=True)


def test_lenet5_is_the_classic_size():
    for shape in ((1, 28, 28), (1, 32, 32)):
        net = LeNet5(shape, 10)
        assert sum(p.numel() for p in net.parameters()) == 61_706
        assert net(torch.randn(2, *shape)).shape == (2, 10)


def test_bert_classifier_loads_local_pretrained_encoder(tmp_path):
    from transformers import AutoModel

    folder = local_bert(tmp_path / "bert")
    from fdlit.models import BertClassifier

    net = BertClassifier((2, 12), 10, model_name=str(folder))
    saved = AutoModel.from_pretrained(str(folder))
    assert torch.equal(net.bert.bert.embeddings.word_embeddings.weight, saved.embeddings.word_embeddings.weight)
    ids = torch.randint(5, 25, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    net.eval()
    out = net(torch.stack([ids, mask], 1))
    assert out.shape == (2, 10)
    # padding is masked: changing padded tokens leaves the logits unchanged
    ids2 = ids.clone()
    ids2[1, 6:] = 0
    assert torch.allclose(net(torch.stack([ids2, mask], 1)), out, atol=1e-5)


def test_bert_offline_not_cached_says_how_to_fetch():
    from fdlit.models import BertClassifier

    with pytest.raises(WeightsUnavailable) as err:
        BertClassifier((2, 8), 10)
    assert "hf download prajjwal1/bert-tiny" in str(err.value)


def test_bert_rejects_image_inputs():
    from fdlit.models import BertClassifier

    with pytest.raises(ConfigError, match="text dataset"):
        BertClassifier((3, 32, 32), 10)


def test_per_client_groups():
    groups = [{"class_path": "fdlit.models.SmallCNN", "fraction": 0.5},
              {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [8]}, "fraction": 0.5}]
    specs = PerClient.assign(groups, 4)
    assert [s["class_path"].rsplit(".", 1)[1] for s in specs] == ["SmallCNN", "SmallCNN", "MLP", "MLP"]
    explicit = [{"class_path": "fdlit.models.MLP", "clients": [3]}, {"class_path": "fdlit.models.SmallCNN", "fraction": 1.0}]
    assert [s["class_path"][-3:] for s in PerClient.assign(explicit, 4)] == ["CNN", "CNN", "CNN", "MLP"]
    spec = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": groups}}
    nets = [build_model(spec, (1, 8, 8), 10, i, 4) for i in range(4)]
    assert [type(n).__name__ for n in nets] == ["SmallCNN", "SmallCNN", "MLP", "MLP"]
    with pytest.raises(ConfigError, match="model.init_args.groups"):
        PerClient.assign([{"class_path": "fdlit.models.MLP", "clients": [0]}], 2)  # client 1 has no network
