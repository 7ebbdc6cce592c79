"""`fdlit data fetch <dataset> --to DIR` writes the files --data.data_dir reads: fetched from a tiny copy on
disk (--from, a hub-layout snapshot or save_to_disk folder, no network), DIR loads to the same pixels and
labels as the source, through the original-format readers (IDX, CIFAR python batches)."""

import gzip

import paper_fixtures  # noqa: F401  (offline HF env first)
import pytest
import torch
from paper_fixtures import image_dataset_dict, save_parquet_hub_layout, yahoo_dataset_dict

import fdlit.data.local_files as local_files
from fdlit.cli import main
from fdlit.data import load_dataset


@pytest.fixture(autouse=True)
def fdlit_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FDLIT_CACHE", str(tmp_path / "fdlit-cache"))


def fetch(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(["data", "fetch", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", ["fashion_mnist", "mnist"])
def test_idx_datasets_round_trip_through_the_original_format(tmp_path, capsys, name):
    dd, arrays = image_dataset_dict(size=28, mode="L", image_col="image", n_train_per_class=3)
    source = save_parquet_hub_layout(dd, tmp_path / "snapshot", name)
    out = fetch(capsys, name, "--to", str(tmp_path / "out"), "--from", str(source))
    assert f"--data.data_dir {tmp_path / 'out'}" in out
    assert gzip.decompress((tmp_path / "out" / "train-images-idx3-ubyte.gz").read_bytes())[:4] == b"\x00\x00\x08\x03"
    assert local_files.find_local_arrays(name, str(tmp_path / "out")) is not None  # read as IDX, not by datasets
    train, test = load_dataset(name, data_dir=str(tmp_path / "out"))
    assert torch.equal(train.x[:, 0], torch.from_numpy(arrays["train"][0]))
    assert torch.equal(test.y, torch.from_numpy(arrays["test"][1]))


def test_cifar10_round_trips_through_the_python_batches(tmp_path, capsys):
    dd, arrays = image_dataset_dict(n_train_per_class=2)
    dd.save_to_disk(str(tmp_path / "c10"))
    fetch(capsys, "cifar10", "--to", str(tmp_path / "out"), "--from", str(tmp_path / "c10"))
    assert sorted(p.name for p in (tmp_path / "out" / "cifar-10-batches-py").iterdir()) == [
        "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]
    train, test = load_dataset("cifar10", data_dir=str(tmp_path / "out"))
    hub_train, hub_test = load_dataset("cifar10", data_dir=str(tmp_path / "c10"))
    assert torch.equal(train.x, hub_train.x) and torch.equal(train.y, hub_train.y)
    assert torch.equal(test.x, torch.from_numpy(arrays["test"][0]).permute(0, 3, 1, 2))


def test_cifar100_keeps_the_fine_labels(tmp_path, capsys):
    dd, arrays = image_dataset_dict(num_classes=100, n_train_per_class=1, n_test_per_class=1,
                                    label_col="fine_label", extra_label="coarse_label")
    dd.save_to_disk(str(tmp_path / "c100"))
    fetch(capsys, "cifar100", "--to", str(tmp_path / "out"), "--from", str(tmp_path / "c100"))
    train, _ = load_dataset("cifar100", data_dir=str(tmp_path / "out"))
    assert torch.equal(train.y, torch.from_numpy(arrays["train"][1])) and int(train.y.max()) == 99


def test_yahoo_answers_becomes_a_save_to_disk_folder(tmp_path, capsys):
    import datasets as hf

    yahoo_dataset_dict().save_to_disk(str(tmp_path / "src"))
    fetch(capsys, "yahoo_answers", "--to", str(tmp_path / "out"), "--from", str(tmp_path / "src"))
    again = hf.load_from_disk(str(tmp_path / "out"))
    assert again["train"]["best_answer"] == hf.load_from_disk(str(tmp_path / "src"))["train"]["best_answer"]


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    assert main(["data", "fetch", "imagenet", "--to", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == ("fdlit: error: dataset: allowed: cifar10, cifar100, fashion_mnist, "
                                               "mnist, yahoo_answers; got 'imagenet'")
    assert main(["data", "fetch", "cifar10"]) == 2
    assert "required: to" in capsys.readouterr().err
    assert main(["data", "pull", "cifar10"]) == 2
    assert capsys.readouterr().err.startswith("fdlit: error: data: allowed: fetch")
