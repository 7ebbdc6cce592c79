"""A deployed node's own data (fdlit.data.node_local) and what a node accepts to build.

The fast tests need no Flower process; the ``deploy`` test runs 3 SuperNodes on loopback, one of
them with a folder of its own images of a single class, and checks the run trained on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch

from fdlit.data.datasets import load_digits
from fdlit.data.fetch import write_idx
from fdlit.data.node_local import node_client_data, read_node_data
from fdlit.errors import ConfigError
from tests.deploying import FEW_EPOCHS

flwr = pytest.importorskip("flwr", reason="the flower extra is not installed")


def digits_folder(folder: Path, label: int, count: int = 60) -> Path:
    """An IDX pair of digits images of one class, in digits' own 0..16 pixel encoding."""
    data = load_digits()
    rows = (data.y == label).nonzero().flatten()[:count]
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / "train-images-idx3-ubyte.gz", (data.x[rows, 0] * 16).round().numpy().astype(np.uint8))
    write_idx(folder / "train-labels-idx1-ubyte.gz", data.y[rows].numpy().astype(np.uint8))
    return folder


def test_a_node_folder_becomes_its_clients_data_in_the_federation_encoding(tmp_path):
    folder = digits_folder(tmp_path / "own", label=9)
    like = load_digits()
    data = node_client_data(folder, like, "digits", [4, 5], seed=0, calibration_fraction=0.2)
    assert [cd.client_id for cd in data] == [4, 5] and all(cd.classes == [9] for cd in data)
    assert sum(len(cd.train) + len(cd.calibration) for cd in data) == 60
    own = torch.cat([torch.cat([cd.train.x, cd.calibration.x]) for cd in data])
    nines = like.x[like.y == 9][:60]
    # the same images as the dataset holds them (0..16 pixels scaled by 1/16), in some order
    assert torch.allclose(own.sum(), nines.sum()) and own.dtype == like.x.dtype and own.shape[1:] == like.x.shape[1:]


def truncated_pair(folder: Path) -> Path:
    (folder / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03\x00\x00\x00\x05junk")  # 5 x ? x ?: cut off
    (folder / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x01\x02")
    return folder


@pytest.mark.parametrize("make, says", [
    (lambda f: f / "missing", "is not a folder"),
    (lambda f: f, "must hold train-images-idx3-ubyte"),
    (lambda f: truncated_pair(f), "bytes"),
])
def test_a_missing_or_malformed_node_folder_is_one_line_naming_the_setting(tmp_path, make, says):
    with pytest.raises(ConfigError) as err:
        read_node_data(make(tmp_path))
    assert str(err.value).startswith("node-config local-data: ") and says in str(err.value)
    assert "\n" not in str(err.value)


def test_a_node_operators_own_loader_gives_the_same_clients_as_the_same_images_in_a_folder(tmp_path, monkeypatch):
    folder = digits_folder(tmp_path / "own", label=3)
    (tmp_path / "hospital_data.py").write_text(
        "import numpy as np\n"
        "from fdlit.data.local_files import read_idx\n"
        "from pathlib import Path\n"
        f"FOLDER = Path({str(folder)!r})\n"
        "def load():\n"
        "    x = read_idx(FOLDER / 'train-images-idx3-ubyte.gz')[:, None]  # N x 1 x H x W, as a loader may give\n"
        "    return x, read_idx(FOLDER / 'train-labels-idx1-ubyte.gz')\n"
        "def broken():\n"
        "    raise OSError('the scanner archive is offline')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    like = load_digits()
    from_folder = node_client_data(folder, like, "digits", [0, 1], 0, 0.2)
    from_loader = node_client_data("hospital_data.load", like, "digits", [0, 1], 0, 0.2)
    for a, b in zip(from_folder, from_loader, strict=True):
        assert a.classes == b.classes == [3] and torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    with pytest.raises(ConfigError, match=r"hospital_data.broken\(\) did not give \(images, labels\): OSError: the scanner"):
        read_node_data("hospital_data.broken")
    with pytest.raises(ConfigError, match="cannot import 'hospital_data.missing'"):
        read_node_data("hospital_data.missing")


def test_node_data_of_another_size_or_more_classes_is_refused(tmp_path):
    folder = tmp_path / "big"
    folder.mkdir()
    write_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((30, 28, 28), np.uint8))
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(30, np.uint8))
    with pytest.raises(ConfigError, match="28 x 28 pixels"):
        node_client_data(folder, load_digits(), "digits", [0], 0, 0.2)
    write_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((30, 8, 8), np.uint8))
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.full(30, 12, np.uint8))
    with pytest.raises(ConfigError, match="classes 0..9"):
        node_client_data(folder, load_digits(), "digits", [0], 0, 0.2)


def test_a_node_refuses_its_bad_local_data_at_its_start_in_one_line(tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fdlit.deployment.supernode", "--insecure", "--superlink",
                           "127.0.0.1:1", "--node-config", f"local-data='{tmp_path / 'nowhere'}'"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and time.monotonic() - started < 60
    assert done.stderr.strip().splitlines() == [f"fdlit: error: node-config local-data: {tmp_path / 'nowhere'} is not "
                                                "a folder (nor a dotted path of a loader)"]


def test_a_node_builds_only_the_class_paths_its_operator_allows():
    from fdlit.deployment.node import check_class_paths

    config = "model:\n  class_path: mylab.models.Net\naggregator:\n  class_path: fdlit.methods.FedAvg\n"
    with pytest.raises(ConfigError) as err:
        check_class_paths(config, "")
    assert str(err.value).startswith("node-config allowed-classes: the run names ['mylab.models.Net']")
    check_class_paths(config, "torch.optim., mylab.")  # the operator allows the lab's own code
    check_class_paths("aggregator:\n  class_path: fdlit.methods.FedAvg\n", "")


def deploy_with_node_settings(tmp_path: Path, settings_of, args: list[str]) -> dict:
    """A 3-SuperNode local deployment whose node i gets ``settings_of(i)`` as node config; the run's outcome."""
    from fdlit.deployment.command import fit_arguments, run_on
    from fdlit.deployment.launcher import LocalDeployment, flower_env

    class NodesWithTheirOwnSettings(LocalDeployment):
        def _supernode_process(self, i):
            base = dict(self.node_settings)
            self.node_settings = {**base, **settings_of(i)}
            try:
                return super()._supernode_process(i)
            finally:
                self.node_settings = base

    work = tmp_path / "work"
    dep = NodesWithTheirOwnSettings(3, work)
    dep.start()
    try:
        options = Namespace(nodes=3, timeout=120, node_wait=120.0, run_timeout=600.0, threads=1, root_certificates=None)
        return run_on(dep.address, work, flower_env(work), options, fit_arguments(args)[0])
    finally:
        dep.stop()


@pytest.mark.deploy
def test_a_node_with_its_own_data_trains_on_it_and_the_server_measures_its_classes(tmp_path):
    folder = digits_folder(tmp_path / "hospital", label=9)
    args = ["--config", "digits.yaml", "--data.num_clients", "6", "--federation.rounds", "2", *FEW_EPOCHS,
            "--federation.executor", "fdlit.execution.SequentialExecutor", "--logger.run_dir", str(tmp_path / "runs")]
    outcome = deploy_with_node_settings(tmp_path, lambda i: {"local-data": str(folder)} if i == 2 else {}, args)
    assert outcome["status"] == "done", outcome
    run = Path(outcome["run_dir"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["client_classes"][4:] == [[9], [9]]  # node 2 hosts clients 4 and 5: the classes it reported
    assert all(len(c) == 2 for c in summary["client_classes"][:4])  # the others: their partition's 2 classes
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # trained on nines only, the node's clients call the test set's nines nines (their local accuracy)
    assert all(a > 0.9 for a in rounds[0]["clients/after_private/local_acc"][4:])
    assert "/hospital" not in (run / "config.yaml").read_text()  # the folder is the node's, not the run's


def test_node_images_outside_the_datasets_value_range_are_refused(tmp_path):
    folder = digits_folder(tmp_path / "own", label=2)
    from fdlit.data.local_files import read_idx

    x = read_idx(folder / "train-images-idx3-ubyte.gz")
    write_idx(folder / "train-images-idx3-ubyte.gz", (x.astype(np.int64) * 255 // 16).astype(np.uint8))  # 0..255
    with pytest.raises(ConfigError) as err:
        node_client_data(folder, load_digits(), "digits", [0], 0, 0.2)
    assert str(err.value) == ("node-config local-data: pixel values 0..255; digits images have gray levels 0..16 "
                              "(scale 0..255 images with x * 16 // 255)")


def fashion_like_folder(folder: Path, classes: list[int], count: int = 60, seed: int = 0) -> Path:
    """A node's own IDX pair of 28 x 28 uint8 images of ``classes`` (Fashion-MNIST's shape and encoding)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / "train-images-idx3-ubyte.gz", rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8))
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.resize(np.array(classes, dtype=np.uint8), count))
    return folder


@pytest.mark.deploy
def test_three_nodes_with_only_their_own_folders_run_a_fashion_mnist_shaped_federation(tmp_path):
    """No node has a copy of the dataset (its data-dir is empty): each gets the shared sets from the server
    and trains on its own folder; the server never reads a node's folder (the run knows no node path)."""
    from paper_fixtures import idx_folder

    idx_folder(tmp_path / "server-data", n_train=400, n_test=60)  # the server's copy: public, test, validation
    empty = tmp_path / "no-dataset-here"
    empty.mkdir()
    folders = [fashion_like_folder(tmp_path / f"node{i}", [2 * i, 2 * i + 1], seed=i) for i in range(3)]

    args = ["--config", "fashion_mnist.yaml", "--data.data_dir", str(tmp_path / "server-data"),
            "--data.num_clients", "6", "--data.classes_per_client", "5", "--data.samples_per_client", "30",
            "--data.public_size", "60", "--data.validation_size", "30", "--federation.rounds", "2", *FEW_EPOCHS,
            "--federation.eval_subsample", "null", "--federation.executor", "fdlit.execution.SequentialExecutor",
            "--logger.run_dir", str(tmp_path / "runs")]
    outcome = deploy_with_node_settings(tmp_path, lambda i: {"local-data": str(folders[i]), "data-dir": str(empty)}, args)
    assert outcome["status"] == "done", outcome
    run = Path(outcome["run_dir"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["finished"] and summary["rounds"] == 2
    assert summary["client_classes"] == [[0, 1], [0, 1], [2, 3], [2, 3], [4, 5], [4, 5]]  # each node's own folder
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rounds) == 2 and all(row["comm/up_bytes"] > 0 for row in rounds)
    saved = (run / "config.yaml").read_text()
    assert all(str(f) not in saved for f in folders) and str(empty) not in saved
