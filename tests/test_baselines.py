"""Baselines (federation.mode local_only / reference) and heterogeneous clients, end to end on small data."""

import json
import math
from pathlib import Path

import paper_fixtures  # noqa: F401  (offline HF env first)
import torch
from paper_fixtures import image_dataset_dict

from fdlit.configuration.schema import parse_fit
from fdlit.data.augment import ImageInput, WithInput
from fdlit.runs.experiment import Experiment


def test_local_only_trains_privately_and_sends_nothing(fast_args):
    parser, cfg = parse_fit(fast_args + ["--federation.mode", "local_only"])
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    summary = experiment.fit()
    assert summary["run"].startswith("local-k3-digits-") and summary["run"].endswith("-seed0")
    assert summary["bytes_up_total"] == 0 and summary["bytes_down_total"] == 0
    for m in loop.history:
        assert m["after_public/global_acc_mean"] == m["after_private/global_acc_mean"]
        assert math.isnan(m["train/public_loss_mean"]) and math.isnan(m["teacher/acc"])
        assert m["comm/up_bytes"] == 0
    assert summary["best_global_acc_mean"] > 0.1  # it did learn something (10 classes)
    rows = [json.loads(line) for line in Path(summary["run_dir"], "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2  # logged the same way as FD runs


def test_reference_is_one_model_on_all_classes_with_public_plus_private_size(fast_args):
    parser, cfg = parse_fit(fast_args + ["--federation.mode", "reference"])
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    summary = experiment.fit()
    assert len(loop.view.clients) == 1 and loop.view.clients[0].classes == list(range(10))
    mean_private = round(sum(len(cd.train) for cd in loop.data.clients) / len(loop.data.clients))
    assert len(loop.parts.tensors.private[0][0]) == len(loop.data.public) + mean_private
    m = loop.history[-1]
    assert m["after_private/local_acc_mean"] == m["after_private/global_acc_mean"]
    assert summary["bytes_up_total"] == 0 and summary["run"].startswith("reference-")
    # labelled, all classes: better than a 3-class client can be on the 10-class test set (<= 0.3 + noise)
    assert summary["best_global_acc_mean"] > 0.5


def test_fd_on_local_cifar_copy_with_heterogeneous_clients(tmp_path):
    dd, _ = image_dataset_dict(n_train_per_class=12, n_test_per_class=3)
    dd.save_to_disk(str(tmp_path / "c10"))
    groups = ('[{"class_path": "fdlit.models.SmallCNN", "init_args": {"channels": 4, "hidden": 8}, "fraction": 0.5},'
              ' {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}, "fraction": 0.5}]')
    parser, cfg = parse_fit([
        "--config", "cifar10.yaml", "--data.data_dir", str(tmp_path / "c10"),
        "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.samples_per_client", "10",
        "--data.public_size", "16", "--model", "fdlit.models.PerClient", "--model.groups", groups,
        "--client.batch_size", "8", "--federation.rounds", "1", "--federation.private_epochs_first", "1",
        "--federation.public_epochs_first", "1", "--federation.accelerator", "cpu",
        "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path / "runs"),
    ])
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    summary = experiment.fit()
    nets = [c.model for c in loop.view.clients]
    assert all(isinstance(n, WithInput) and isinstance(n.input, ImageInput) and n.input.augment for n in nets)
    assert [type(n.net).__name__ for n in nets] == ["SmallCNN", "SmallCNN", "MLP", "MLP"]
    # images stay uint8 on the training device; conversion happens per batch inside the model
    assert loop.parts.tensors.public_x.dtype == torch.uint8 and loop.parts.tensors.public_x.device == loop.fabric.device
    assert loop.parts.tensors.private[0][0].dtype == torch.uint8
    assert summary["bytes_up_total"] > 0 and summary["finished"]
    # every client gets its own augmentation stream
    assert len({n.input.seed for n in nets}) == 4


def test_image_dataset_clients_are_vectorized_by_default_and_match_sequential(tmp_path):
    """CIFAR clients carry the ImageInput module (uint8 -> float, crop + flip): the default executor
    still vectorizes them (the GPU case) and the run equals the sequential one."""
    dd, _ = image_dataset_dict(n_train_per_class=12, n_test_per_class=3)
    dd.save_to_disk(str(tmp_path / "c10"))
    history = {}
    for executor in ("null", "fdlit.execution.SequentialExecutor"):
        parser, cfg = parse_fit([
            "--config", "cifar10.yaml", "--data.data_dir", str(tmp_path / "c10"),
            "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.samples_per_client", "10",
            "--data.public_size", "16", "--model", "fdlit.models.SmallCNN", "--model.channels", "4",
            "--model.hidden", "8", "--client.batch_size", "4", "--federation.rounds", "2",
            "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
            "--federation.private_epochs", "1", "--federation.public_epochs", "1",
            "--federation.accelerator", "cpu", "--federation.executor", executor,
            "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path / executor),
        ])
        experiment = Experiment(cfg, parser)
        loop = experiment.loop
        experiment.fit()
        history[executor] = loop.history
        if executor == "null":
            assert type(loop.settings.executor).__name__ == "VectorizedExecutor"
            assert loop.settings.executor._vectorized == {c.client_id for c in loop.view.clients}  # no fallback
    for vec, seq in zip(history["null"], history["fdlit.execution.SequentialExecutor"], strict=True):
        for key in ("after_private/global_acc_mean", "after_public/global_acc_mean", "teacher/acc"):
            assert math.isclose(vec[key], seq[key], abs_tol=1e-6), key
        assert math.isclose(vec["train/public_loss_mean"], seq["train/public_loss_mean"], rel_tol=1e-4)


def test_fd_on_local_yahoo_copy_with_a_local_bert(tmp_path):
    from paper_fixtures import local_bert, yahoo_dataset_dict

    yahoo_dataset_dict().save_to_disk(str(tmp_path / "yahoo"))
    bert = local_bert(tmp_path / "bert")
    parser, cfg = parse_fit([
        "--config", "yahoo.yaml", "--data.data_dir", str(tmp_path / "yahoo"), "--data.tokenizer", str(bert),
        "--data.max_length", "16", "--data.max_train_samples", "null",
        "--data.num_clients", "5", "--data.classes_per_client", "2", "--data.samples_per_client", "10",
        "--data.public_size", "10", "--model.model_name", str(bert),
        "--federation.rounds", "1", "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
        "--federation.accelerator", "cpu",
        "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path / "runs"),
    ])
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    summary = experiment.fit()
    assert type(loop.view.clients[0].model).__name__ == "BertClassifier"  # text: no input module in front
    assert loop.parts.tensors.public_x.shape == (10, 2, 16) and loop.parts.tensors.public_x.dtype == torch.int64
    assert summary["finished"] and summary["bytes_up_total"] > 0
    assert 0.0 <= summary["best_global_acc_mean"] <= 1.0
