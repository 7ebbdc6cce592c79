"""Datasets from their original files: IDX (MNIST, Fashion-MNIST; gzipped or not) and the CIFAR python
batches, written here in the real formats; the real Fashion-MNIST files where Debian's package is installed."""

import pickle
from pathlib import Path

import numpy as np
import paper_fixtures  # noqa: F401  (offline HF env first)
import pytest
import torch
from paper_fixtures import idx_folder

import fdlit.data.local_files as local_files
from fdlit.data import FederatedData, load_dataset
from fdlit.data.hub import DatasetUnavailable
from fdlit.errors import ConfigError

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


def cifar_folder(folder: Path, fine: bool, per_batch=6, seed=0):
    """cifar-10-batches-py (5 training batches + test_batch) or cifar-100-python (train, test)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = ["train", "test"] if fine else [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    rows = {}
    for i, name in enumerate(names):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [(i + j) % (100 if fine else 10) for j in range(per_batch)]
        batch = {b"data": data, b"fine_labels" if fine else b"labels": labels}
        if fine:
            batch[b"coarse_labels"] = [0] * per_batch  # must not be used
        (folder / name).write_bytes(pickle.dumps(batch))
        rows[name] = (data, labels)
    return rows


@pytest.fixture
def no_debian_copy(monkeypatch, tmp_path):
    """As on a machine without the Debian package, whatever this one has installed."""
    for name in ("fashion_mnist", "mnist"):
        src = local_files.LOCAL_SOURCES[name]
        monkeypatch.setitem(local_files.LOCAL_SOURCES, name,
                            local_files.LocalSource(src.format, src.url, src.subfolders, str(tmp_path / "absent"),
                                                    src.apt_package))


@pytest.mark.parametrize("gz", [True, False])
def test_idx_files_load_with_exact_pixels_and_labels(tmp_path, gz):
    arrays = idx_folder(tmp_path / "fm", gz=gz)
    train, test = load_dataset("fashion_mnist", data_dir=str(tmp_path / "fm"))
    assert train.x.dtype == torch.uint8 and train.x.shape == (40, 1, 28, 28) and test.x.shape == (20, 1, 28, 28)
    assert np.array_equal(train.x[:, 0].numpy(), arrays["train"][0])
    assert np.array_equal(test.y.numpy(), arrays["t10k"][1]) and test.y.dtype == torch.long
    # the dataset's normalisation (Fashion-MNIST's mean/std) comes with the data
    module = train.input_transform()
    assert module.mean.flatten().tolist() == pytest.approx([0.2860]) and module.augment is False


def test_torchvision_layout_and_mnist(tmp_path):
    arrays = idx_folder(tmp_path / "root" / "MNIST" / "raw", gz=False, seed=3)
    train, _ = load_dataset("mnist", data_dir=str(tmp_path / "root"))
    assert np.array_equal(train.x[:, 0].numpy(), arrays["train"][0])
    assert train.input_transform().mean.flatten().tolist() == pytest.approx([0.1307])


def test_fashion_mnist_is_found_in_the_default_location(tmp_path, monkeypatch):
    arrays = idx_folder(tmp_path / "debian", seed=5)
    src = local_files.LOCAL_SOURCES["fashion_mnist"]
    monkeypatch.setitem(local_files.LOCAL_SOURCES, "fashion_mnist",
                        local_files.LocalSource(src.format, src.url, src.subfolders, str(tmp_path / "debian")))
    train, _ = load_dataset("fashion_mnist")  # no data_dir
    assert np.array_equal(train.x[:, 0].numpy(), arrays["train"][0])


def test_cifar10_python_batches_from_the_unpacked_tarball(tmp_path):
    rows = cifar_folder(tmp_path / "dl" / "cifar-10-batches-py", fine=False)
    train, test = load_dataset("cifar10", data_dir=str(tmp_path / "dl"))  # the tarball's parent folder
    assert train.x.shape == (30, 3, 32, 32) and test.x.shape == (6, 3, 32, 32) and train.x.dtype == torch.uint8
    data, labels = rows["data_batch_2"]
    # a row is 1024 red, then 1024 green, then 1024 blue values, each row-major 32 x 32
    assert np.array_equal(train.x[6:12, 1].numpy(), data[:, 1024:2048].reshape(6, 32, 32))
    assert train.y[6:12].tolist() == labels
    assert np.array_equal(test.x.reshape(6, -1).numpy(), rows["test_batch"][0])


def test_cifar100_python_uses_fine_labels(tmp_path):
    rows = cifar_folder(tmp_path / "cifar-100-python", fine=True)
    train, test = load_dataset("cifar100", data_dir=str(tmp_path / "cifar-100-python"))
    assert train.y.tolist() == rows["train"][1] and test.y.tolist() == rows["test"][1]
    assert train.num_classes == 100


def test_incomplete_or_broken_files_name_what_is_wrong(tmp_path):
    idx_folder(tmp_path / "partial")
    (tmp_path / "partial" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(ConfigError, match="t10k-labels-idx1-ubyte") as err:
        load_dataset("fashion_mnist", data_dir=str(tmp_path / "partial"))
    assert err.value.field == "data.data_dir"
    idx_folder(tmp_path / "cut", gz=False)
    path = tmp_path / "cut" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ConfigError, match="truncated"):
        load_dataset("fashion_mnist", data_dir=str(tmp_path / "cut"))
    (tmp_path / "bad").mkdir()
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (tmp_path / "bad" / stem).write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(ConfigError, match="not an IDX file"):
        load_dataset("fashion_mnist", data_dir=str(tmp_path / "bad"))


def test_missing_dataset_names_every_way_to_get_it(no_debian_copy):
    with pytest.raises(DatasetUnavailable) as err:
        load_dataset("fashion_mnist")
    msg = str(err.value)
    assert "apt-get install dataset-fashion-mnist" in msg  # the Debian package
    assert "fashion-mnist.s3-website.eu-central-1.amazonaws.com" in msg  # the original files
    assert "zalando-datasets/fashion_mnist" in msg and "--data.data_dir" in msg  # the hub
    with pytest.raises(DatasetUnavailable) as err:
        load_dataset("cifar10")
    assert "cifar-10-python.tar.gz" in str(err.value) and "uoft-cs/cifar10" in str(err.value)
    assert "apt-get" not in str(err.value)  # no Debian package to name


def test_federated_data_from_idx_files_with_validation(tmp_path):
    idx_folder(tmp_path / "fm", n_train=400, n_test=50)
    data = FederatedData("fashion_mnist", num_clients=5, classes_per_client=2, samples_per_client=20,
                         public_size=50, validation_size=30, data_dir=str(tmp_path / "fm")).setup(0)
    assert len(data.test) == 50 and len(data.public) == 50 and len(data.validation) == 30
    assert data.input_shape == (1, 28, 28) and data.public.x.dtype == torch.uint8
    assert all(len(c.train) + len(c.calibration) == 20 for c in data.clients)


@pytest.mark.skipif(not DEBIAN_FASHION.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_the_real_fashion_mnist_files():
    train, test = load_dataset("fashion_mnist")
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert train.y.bincount().tolist() == [6000] * 10 and test.y.bincount().tolist() == [1000] * 10
    # the published training-set pixel mean (Xiao et al. 2017), the normalisation fdlit applies
    assert train.x.float().mean().item() / 255 == pytest.approx(0.2860, abs=1e-4)
    assert train.y[:5].tolist() == [9, 0, 0, 3, 0]  # the first labels of train-labels-idx1-ubyte


def test_a_cifar_batch_that_would_run_code_is_refused(tmp_path):
    import pickle

    from fdlit.data.local_files import _unpickle

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": Evil()}))
    with pytest.raises(ConfigError, match="not a CIFAR python batch.*builtins.print is not allowed"):
        _unpickle(path)


def test_input_scaling_unit_and_standardize_on_idx_files(tmp_path):
    idx_folder(tmp_path / "fm", n_train=400, n_test=50, seed=2)
    common = dict(num_clients=5, classes_per_client=2, samples_per_client=20, public_size=50,
                  data_dir=str(tmp_path / "fm"))
    stored = None
    for scaling in ("unit", "standardize", None):
        data = FederatedData("fashion_mnist", input_scaling=scaling, **common).setup(0)
        x = data.public.x
        stored = x if stored is None else stored
        assert torch.equal(x, stored) and x.dtype == torch.uint8  # stored pixels never change
        out = data.input_transform().eval()(x)
        if scaling == "unit":
            assert out.min().item() >= 0 and out.max().item() <= 1
            assert out.min().item() == x.min().item() / 255 and out.max().item() == x.max().item() / 255
            assert out.mean().item() == pytest.approx(x.float().mean().item() / 255, rel=1e-5)
        else:  # Fashion-MNIST's training-set statistics, as before the knob existed
            assert out.mean().item() == pytest.approx((x.float().mean().item() / 255 - 0.2860) / 0.3530, rel=1e-4)
            assert out.min().item() == pytest.approx(-0.2860 / 0.3530 + x.min().item() / 255 / 0.3530, abs=1e-5)
            assert out.max().item() > 1.5  # (255/255 - 0.286) / 0.353 = 2.02 for the brightest pixel


def test_input_scaling_unit_on_cifar_batches_is_per_channel_x_over_255(tmp_path):
    cifar_folder(tmp_path / "cifar-10-batches-py", fine=False, per_batch=20)
    unit, _ = load_dataset("cifar10", data_dir=str(tmp_path), input_scaling="unit", augment=False)
    std, _ = load_dataset("cifar10", data_dir=str(tmp_path), augment=False)
    x = unit.x[:8]
    assert torch.equal(unit.input_transform().eval()(x), x.float() / 255)
    red = std.input_transform().eval()(x)[:, 0]
    assert torch.allclose(red, (x[:, 0].float() / 255 - 0.4914) / 0.2470)


def test_bad_input_scaling_names_the_allowed_values():
    with pytest.raises(ConfigError, match=r"data\.input_scaling: allowed: 'standardize', 'unit', null.*got 'minmax'"):
        FederatedData("fashion_mnist", input_scaling="minmax")
    with pytest.raises(ConfigError, match=r"'digits' has no 'standardize' scaling \(allowed: 'unit' or null\)"):
        FederatedData("digits", input_scaling="standardize")
    with pytest.raises(ConfigError, match="text dataset"):
        FederatedData("yahoo_answers", partition="dirichlet", input_scaling="unit")
    assert FederatedData("digits", input_scaling="unit").input_scaling == "unit"


@pytest.mark.skipif(not DEBIAN_FASHION.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_real_fashion_mnist_standardized_has_zero_mean_and_unit_std():
    std, _ = load_dataset("fashion_mnist")
    unit, _ = load_dataset("fashion_mnist", input_scaling="unit")
    x = std.x[:20000]
    s, u = std.input_transform().eval()(x), unit.input_transform().eval()(x)
    assert s.mean().item() == pytest.approx(0.0, abs=0.01) and s.std().item() == pytest.approx(1.0, abs=0.01)
    assert u.min().item() == 0.0 and u.max().item() == 1.0 and u.mean().item() == pytest.approx(0.286, abs=0.002)
