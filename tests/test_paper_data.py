"""Paper dataset loaders on tiny local copies in the real on-disk formats (save_to_disk, hub parquet)."""

import numpy as np
import paper_fixtures  # noqa: F401  (offline HF env first)
import pytest
import torch
from paper_fixtures import image_dataset_dict, local_bert, save_parquet_hub_layout, yahoo_dataset_dict

from fdlit.data import FederatedData, load_dataset
from fdlit.data.augment import ImageInput, random_crop_flip
from fdlit.data.hub import HUB_DATASETS, DatasetUnavailable


@pytest.fixture(autouse=True)
def fdlit_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FDLIT_CACHE", str(tmp_path / "fdlit-cache"))


def test_cifar10_from_save_to_disk_keeps_exact_uint8_pixels(tmp_path):
    dd, arrays = image_dataset_dict()
    dd.save_to_disk(str(tmp_path / "cifar10"))
    train, test = load_dataset("cifar10", data_dir=str(tmp_path / "cifar10"))
    pix, labels = arrays["train"]
    assert train.x.dtype == torch.uint8 and train.x.shape == (60, 3, 32, 32)
    assert torch.equal(train.x, torch.from_numpy(pix).permute(0, 3, 1, 2))
    assert torch.equal(train.y, torch.from_numpy(labels))
    assert len(test) == 20 and train.num_classes == 10
    module = train.input_transform(seed=1)
    assert isinstance(module, ImageInput) and module.augment  # CIFAR default: augmentation on
    assert load_dataset("cifar10", data_dir=str(tmp_path / "cifar10"), augment=False)[0].input_transform().augment is False


def test_mnist_from_hub_parquet_layout_is_grey_uint8(tmp_path):
    dd, arrays = image_dataset_dict(size=28, mode="L", image_col="image")
    root = save_parquet_hub_layout(dd, tmp_path / "mnist-snapshot", "mnist")
    train, test = load_dataset("mnist", data_dir=str(root))
    assert train.x.shape == (60, 1, 28, 28) and train.x.dtype == torch.uint8
    assert torch.equal(test.x[:, 0], torch.from_numpy(arrays["test"][0]))
    assert train.input_transform().augment is False


def test_cifar100_uses_fine_labels(tmp_path):
    dd, arrays = image_dataset_dict(num_classes=100, n_train_per_class=1, n_test_per_class=1,
                                    label_col="fine_label", extra_label="coarse_label")
    dd.save_to_disk(str(tmp_path / "c100"))
    train, _ = load_dataset("cifar100", data_dir=str(tmp_path / "c100"))
    assert train.num_classes == 100 and int(train.y.max()) == 99
    assert torch.equal(train.y, torch.from_numpy(arrays["train"][1]))


def test_yahoo_concatenates_title_content_answer_and_caches_tokens(tmp_path, monkeypatch):
    dd = yahoo_dataset_dict()
    dd.save_to_disk(str(tmp_path / "yahoo"))
    tok_dir = local_bert(tmp_path / "bert")
    train, test = load_dataset("yahoo_answers", data_dir=str(tmp_path / "yahoo"), tokenizer=str(tok_dir), max_length=24)
    assert train.x.shape == (80, 2, 24) and train.x.dtype == torch.int64 and len(test) == 20
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    row = dd["train"][1]
    expected = " ".join(s for s in (row["question_title"], row["question_content"], row["best_answer"]) if s)
    ids, mask = train.x[1, 0], train.x[1, 1]
    assert tok.decode(ids[mask.bool()], skip_special_tokens=True) == expected
    assert mask.sum() == len(expected.split()) + 2  # [CLS] ... [SEP]
    assert torch.equal(train.y, torch.tensor(dd["train"]["topic"]))
    # tokenised once: a second load reads the cache and never builds a tokenizer
    import fdlit.data.hub as hub

    monkeypatch.setattr(hub, "load_tokenizer", lambda *a: (_ for _ in ()).throw(AssertionError("re-tokenised")))
    again, _ = load_dataset("yahoo_answers", data_dir=str(tmp_path / "yahoo"), tokenizer=str(tok_dir), max_length=24)
    assert torch.equal(again.x, train.x)


def test_max_train_samples_is_class_balanced_and_seed_free(tmp_path):
    dd, _ = image_dataset_dict(n_train_per_class=6)
    dd.save_to_disk(str(tmp_path / "c10"))
    a, _ = load_dataset("cifar10", data_dir=str(tmp_path / "c10"), max_train_samples=30)
    b, _ = load_dataset("cifar10", data_dir=str(tmp_path / "c10"), max_train_samples=30)
    assert len(a) == 30 and torch.equal(torch.bincount(a.y), torch.full((10,), 3))
    assert torch.equal(a.x, b.x)


def test_missing_data_dir_names_the_field_and_the_fetch_command(tmp_path):
    with pytest.raises(DatasetUnavailable) as err:
        load_dataset("cifar10", data_dir=str(tmp_path / "nowhere"))
    assert err.value.field == "data.data_dir" and "uoft-cs/cifar10" in str(err.value)


def test_offline_and_not_cached_says_where_and_how(tmp_path, monkeypatch):
    import fdlit.data.local_files as local_files

    src = local_files.LOCAL_SOURCES["fashion_mnist"]  # as without Debian's package, whatever is installed here
    monkeypatch.setitem(local_files.LOCAL_SOURCES, "fashion_mnist",
                        local_files.LocalSource(src.format, src.url, src.subfolders, str(tmp_path / "absent")))
    with pytest.raises(DatasetUnavailable) as err:
        load_dataset("fashion_mnist")
    msg = str(err.value)
    assert "zalando-datasets/fashion_mnist" in msg
    assert "load_dataset('zalando-datasets/fashion_mnist')" in msg and "--data.data_dir" in msg


def test_every_paper_dataset_is_registered():
    from fdlit.data import DATASETS

    assert {"cifar10", "cifar100", "mnist", "fashion_mnist", "yahoo_answers"} <= set(DATASETS)
    assert HUB_DATASETS["yahoo_answers"].text == ("question_title", "question_content", "best_answer")


def _reference_crop_flip(x, padding):
    """Every output a per-sample crop/flip can produce, computed one sample at a time."""
    out = []
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    for i in range(n):
        cands = []
        for dy in range(2 * padding + 1):
            for dx in range(2 * padding + 1):
                crop = padded[i, :, dy:dy + h, dx:dx + w]
                cands += [crop, crop.flip(-1)]
        out.append(cands)
    return out


def test_batched_crop_flip_matches_per_sample_definition():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=g)
    y = random_crop_flip(x, 2, torch.Generator().manual_seed(1))
    assert y.dtype == torch.uint8 and y.shape == x.shape
    cands = _reference_crop_flip(x, 2)
    assert all(any(torch.equal(y[i], c) for c in cands[i]) for i in range(len(x)))
    assert not torch.equal(y, x)  # something moved
    flips = sum(torch.equal(y[i], x[i].flip(-1)) for i in range(16))
    assert torch.equal(random_crop_flip(x, 2, torch.Generator().manual_seed(1)), y)  # reproducible
    assert not torch.equal(random_crop_flip(x, 2, torch.Generator().manual_seed(2)), y)
    assert flips <= 16


def test_image_input_normalises_and_augments_only_in_training():
    m = ImageInput(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), augment=True, seed=0)
    x = torch.randint(0, 256, (8, 3, 8, 8), dtype=torch.uint8)
    m.eval()
    expected = (x.float() / 255 - 0.5) / 0.25
    assert torch.allclose(m(x), expected)
    m.train()
    first = m(x)
    assert not torch.allclose(first, expected)
    assert not torch.allclose(m(x), first)  # the stream advances from batch to batch


def test_federated_data_on_local_cifar_copy(tmp_path):
    dd, _ = image_dataset_dict(n_train_per_class=10)
    dd.save_to_disk(str(tmp_path / "c10"))
    data = FederatedData("cifar10", num_clients=5, classes_per_client=2, samples_per_client=8, public_size=20,
                         data_dir=str(tmp_path / "c10")).setup(0)
    assert data.public.x.dtype == torch.uint8 and len(data.public) == 20 and len(data.test) == 20
    assert data.input_shape == (3, 32, 32) and data.input_transform is not None
    assert all(len(c.train) + len(c.calibration) == 8 for c in data.clients)
    assert all(set(np.unique(c.train.y.numpy())) <= set(c.classes) for c in data.clients)
