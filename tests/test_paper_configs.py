"""The shipped paper configs carry the papers' settings (docs/algorithms.md "Paper settings to reproduce"),
and a paper run without its data fails cleanly before any run directory or W&B run exists."""

import os
import subprocess
import sys
from pathlib import Path

import paper_fixtures  # noqa: F401  (offline HF env first)
import pytest

from fdlit.configuration.schema import parse_fit

REPO = Path(__file__).resolve().parents[1]

# Typed from docs/algorithms.md "Paper settings to reproduce" (Kovalchuk et al. 2026, Table 2, App. A;
# Kovalchuk et al. 2025 (workshop) for MNIST).
# (M, k default [sweep], private samples/client, public size, model class, pretrained, optimizer, lr,
#  batch, epochs first round, epochs later, rounds, aggregator, tau, other aggregator arguments)
PAPER = {
    "cifar10.yaml": dict(source=["Kovalchuk et al. 2026", "arXiv 2509.15147", "Table 2"],
                         M=20, k=2, k_sweep=[2, 3, 4, 5, 7, 9], private=5000, public=5000, model="ResNet18",
                         pretrained=False, optimizer="adam", lr=1e-3, batch=128, first=20, later=2, rounds=50,
                         aggregator="SmoothedUncertaintyWeighted", tau=0.25, dataset="cifar10"),
    "cifar100.yaml": dict(source=["Kovalchuk et al. 2026", "arXiv 2509.15147", "Table 2"],
                          M=20, k=20, k_sweep=[20, 30, 40, 50, 70, 90], private=5000, public=5000, model="ResNet18",
                          pretrained=True, optimizer="adam", lr=1e-4, batch=128, first=1, later=1, rounds=50,
                          aggregator="SmoothedUncertaintyWeighted", tau=0.25, dataset="cifar100"),
    "yahoo.yaml": dict(source=["Kovalchuk et al. 2026", "arXiv 2509.15147", "Table 2"],
                       M=20, k=2, k_sweep=[2, 3, 4, 5, 7, 9], private=1500, public=2000, model="BertClassifier",
                       pretrained=True, optimizer="adamw", lr=2e-5, batch=32, first=3, later=1, rounds=50,
                       aggregator="SmoothedUncertaintyWeighted", tau=0.25, dataset="yahoo_answers"),
    "cifar10_workshop.yaml": dict(source=["Kovalchuk et al. 2025"], M=20, k=5, k_sweep=[2, 5, 8], private=10000, public=5000,
                             model="ResNet18", pretrained=False, optimizer="adam", lr=1e-3, batch=128, first=20,
                             later=5, rounds=50, aggregator="UncertaintyWeighted", tau=None,
                             dataset="cifar10", init_args={"mix": "logits"}),
    "mnist.yaml": dict(source=["Kovalchuk et al. 2025"],
                       M=20, k=2, k_sweep=[2, 5, 8], private=10000, public=5000, model="LeNet5",
                       pretrained=None, optimizer="adam", lr=1e-3, batch=128, first=10, later=1, rounds=50,
                       aggregator="UncertaintyWeighted", tau=None, dataset="mnist",
                       init_args={"mix": "logits"}),
}
# the workshop paper's Meta-Model aggregator in the same two settings: 3,000 labelled images (App. A.2)
for _name in ("mnist", "cifar10_workshop"):
    PAPER[f"{_name}_meta_model.yaml"] = {**PAPER[f"{_name}.yaml"], "aggregator": "MetaModel",
                                         "init_args": {"labelled_size": 3000, "labelled_per_client": None}}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_config_matches_the_paper(name):
    want = PAPER[name]
    _, cfg = parse_fit(["--config", name])
    d, f, c = cfg.data, cfg.federation, cfg.client
    assert d.dataset == want["dataset"]
    assert d.num_clients == want["M"] and d.partition == "classes"
    assert d.classes_per_client == want["k"] and want["k"] in want["k_sweep"]
    assert d.samples_per_client == want["private"] and d.public_size == want["public"]
    assert d.calibration_fraction == 0.2
    assert cfg.model.class_path.rsplit(".", 1)[1] == want["model"]
    if want["pretrained"] is not None:
        assert cfg.model.init_args.pretrained is want["pretrained"]
    assert c.optimizer == want["optimizer"] and c.lr == pytest.approx(want["lr"]) and c.batch_size == want["batch"]
    assert c.public_batch_size is None and c.public_lr is None  # both phases use the paper's values
    assert (f.private_epochs_first, f.private_epochs) == (want["first"], want["later"])
    assert (f.public_epochs_first, f.public_epochs) == (want["first"], want["later"])
    assert f.rounds == want["rounds"] and f.mode == "fd"
    assert cfg.aggregator.class_path.rsplit(".", 1)[1] == want["aggregator"]
    if want["tau"] is not None:
        assert cfg.aggregator.init_args.tau == want["tau"]
    for key, value in want.get("init_args", {}).items():
        assert cfg.aggregator.init_args[key] == value, key
    text = (REPO / "configs" / name).read_text()
    assert all(src in text for src in want["source"])  # names its source in a comment


def test_cifar100_backbone_is_the_imagenet_resnet():
    _, cfg = parse_fit(["--config", "cifar100.yaml"])
    assert cfg.model.init_args.stem == "imagenet"
    _, cfg = parse_fit(["--config", "cifar10.yaml"])
    assert cfg.model.init_args.stem == "cifar"


def test_paper_run_without_data_exits_nonzero_before_any_run(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "FDLIT_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb-dir"),
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "fdlit", "fit", "--config", str(REPO / "configs" / "cifar10.yaml"),
                          "--logger.run_dir", str(tmp_path / "runs"), "--logger.mode", "offline"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "cifar10" in out.stderr and "uoft-cs/cifar10" in out.stderr and "load_dataset(" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()  # no run directory
    assert not (tmp_path / "wandb").exists() and not (tmp_path / "wandb-dir").exists()  # no W&B run


# training-split class counts of the real datasets (Yahoo: after the config's max_train_samples cap)
CLASS_COUNTS = {
    "cifar10": [5000] * 10,
    "cifar100": [500] * 100,
    "mnist": [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949],
    "yahoo_answers": [10000] * 10,
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_config_partition_is_feasible_on_the_real_split_sizes(name, monkeypatch):
    """The paper's k / private / public sizes fit the real datasets (labels only, no pixels)."""
    import numpy as np
    import torch

    from fdlit.data import DATASETS, TensorDataset

    _, cfg = parse_fit(["--config", name])
    counts = CLASS_COUNTS[cfg.data.dataset]
    if cfg.data.dataset == "yahoo_answers":
        assert cfg.data.max_train_samples == sum(counts)
    y = torch.from_numpy(np.repeat(np.arange(len(counts)), counts))
    fake = lambda **_: (TensorDataset(torch.zeros(len(y), 1), y, len(counts), "train"),  # noqa: E731
                        TensorDataset(torch.zeros(10, 1), torch.arange(10) % len(counts), len(counts), "test"))
    monkeypatch.setitem(DATASETS, cfg.data.dataset, fake)
    from fdlit.data import FederatedData

    d = cfg.data
    data = FederatedData(d.dataset, d.num_clients, d.partition, d.classes_per_client, d.dirichlet_alpha,
                         d.samples_per_client, d.public_size, d.test_fraction, d.calibration_fraction,
                         d.calibration).setup(0)
    assert len(data.public) == d.public_size and len(data.clients) == 20
    for c in data.clients:
        assert len(c.classes) == d.classes_per_client
        assert len(c.train) + len(c.calibration) == d.samples_per_client
        assert abs(len(c.calibration) - 0.2 * d.samples_per_client) <= d.classes_per_client


def test_mnist_f2l_is_f2ls_table_4_setting_and_feasible_on_mnist(monkeypatch):
    """F2L (Nguyen et al. 2022), App. E / Table 4, MNIST: 3 regions x 10 clients, 1,600 samples each,
    Dirichlet 0.1, 3,200 labelled samples on the server, LeNet-5, 5 local epochs at lr 0.05."""
    import numpy as np
    import torch

    from fdlit.data import DATASETS, FederatedData, TensorDataset

    _, cfg = parse_fit(["--config", "mnist_f2l.yaml"])
    d, f, a = cfg.data, cfg.federation, cfg.aggregator
    assert (d.dataset, d.num_clients, d.partition, d.dirichlet_alpha) == ("mnist", 30, "dirichlet", 0.1)
    assert (d.samples_per_client, d.max_train_samples, d.public_size) == (None, 48000 + 3200, 3200)
    assert cfg.model.class_path.endswith("LeNet5") and cfg.client.lr == 0.05
    assert (f.private_epochs_first, f.private_epochs, f.public_epochs) == (5, 5, 0)
    assert a.class_path.endswith("F2LParams")
    assert (a.init_args.regions, a.init_args.global_every, a.init_args.hard_weight) == (3, 8, 0.01)
    assert "Nguyen et al. 2022" in (REPO / "configs" / "mnist_f2l.yaml").read_text()
    counts = CLASS_COUNTS["mnist"]
    y = torch.from_numpy(np.repeat(np.arange(10), counts))
    cap = d.max_train_samples

    def fake(**_):
        keep = torch.cat([torch.nonzero(y == c).flatten()[: cap // 10 + (c < cap % 10)] for c in range(10)])
        return (TensorDataset(torch.zeros(len(keep), 1), y[keep], 10, "train"),
                TensorDataset(torch.zeros(10, 1), torch.arange(10), 10, "test"))

    monkeypatch.setitem(DATASETS, "mnist", fake)
    data = FederatedData(d.dataset, d.num_clients, d.partition, d.classes_per_client, d.dirichlet_alpha,
                         d.samples_per_client, d.public_size, d.test_fraction, d.calibration_fraction,
                         d.calibration).setup(0)
    assert len(data.public) == 3200 and len(data.clients) == 30
    assert sum(len(c.train) + len(c.calibration) for c in data.clients) == 48000
