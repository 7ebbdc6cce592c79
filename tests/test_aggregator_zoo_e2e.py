"""Every aggregator-zoo rule runs end to end on digits from its shipped config (tiny: 4 clients, 1 round)."""

import json
from pathlib import Path

import pytest

from fdlit.configuration.schema import parse_fit
from fdlit.runs.experiment import Experiment

CONFIGS = {
    "digits_logit_averaging.yaml": [],
    "digits_era.yaml": [],
    "digits_entropy.yaml": [],
    "digits_logit_variance.yaml": [],
    "digits_oracle.yaml": [],
    "digits_selective_fd.yaml": ["logits", "mask"],
    "digits_selective_fd_hard.yaml": ["labels", "mask"],
    "digits_fedgo.yaml": ["discriminator_log_odds", "num_samples"],
    "digits_lkd.yaml": ["class_auc"],
    "digits_meta_model.yaml": ["mm_inputs", "mm_labels", "mm_logits"],
    "digits_fedema_distill.yaml": [],
    "digits_edgefd.yaml": ["logits", "mask"],
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_rule_runs_end_to_end_and_counts_what_clients_send(config, tmp_path):
    argv = ["--config", config, "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", "1",
            "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
            "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "150"]
    parser, cfg = parse_fit(argv)
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    summary = experiment.fit()
    assert summary["finished"] and 0.0 <= summary["best_global_acc_mean"] <= 1.0
    kinds = {(m.direction, m.kind) for m in loop.server_side.ledger.messages}
    for kind in CONFIGS[config]:
        assert ("up", kind) in kinds, f"{kind} was not counted as sent"
    up = sum(m.bytes for m in loop.server_side.ledger.messages if m.direction == "up")
    assert summary["bytes_up_total"] == up > 0
    metrics = json.loads(Path(summary["run_dir"], "metrics.jsonl").read_text().splitlines()[-1])
    assert 0.0 <= metrics["teacher/kept_fraction"] <= 1.0


def test_selective_fd_hard_labels_send_fewer_bytes_than_soft(tmp_path):
    totals, teachers = {}, {}
    for config in ("digits_selective_fd.yaml", "digits_selective_fd_hard.yaml"):
        argv = ["--config", config, "--logger.mode", "disabled", "--logger.progress", "false",
                "--logger.run_dir", str(tmp_path), "--federation.rounds", "1", "--federation.private_epochs_first", "1",
                "--federation.public_epochs_first", "0", "--data.num_clients", "4", "--data.classes_per_client", "3",
                "--data.public_size", "150"]
        experiment = Experiment(parse_fit(argv)[1])
        loop = experiment.loop
        totals[config] = experiment.fit()["bytes_up_total"]
        teachers[config] = [m for m in loop.server_side.ledger.messages if m.kind == "teacher"]
    # one uint8 class id per kept row instead of C float32 logits, up and down
    assert totals["digits_selective_fd_hard.yaml"] * 10 < totals["digits_selective_fd.yaml"]
    hard, soft = teachers["digits_selective_fd_hard.yaml"], teachers["digits_selective_fd.yaml"]
    assert len(hard) == 4 and all(m.dtype == "uint8" and m.bytes == m.shape[0] and len(m.shape) == 1 for m in hard)
    assert all(m.dtype == "float32" and m.shape[1:] == (10,) and m.bytes == 40 * m.shape[0] for m in soft)


def test_one_hot_teachers_travel_as_class_ids_and_rebuild_exactly():
    import torch

    from fdlit.federation.protocols import encode_teacher

    ids = torch.tensor([3, 0, 9, 3])
    sent, targets = encode_teacher(torch.nn.functional.one_hot(ids, 10).float(), torch.float16)
    assert sent.dtype == torch.uint8 and torch.equal(sent.long(), ids)
    assert torch.equal(targets, torch.nn.functional.one_hot(ids, 10).float())
    sent, _ = encode_teacher(torch.nn.functional.one_hot(torch.tensor([299]), 300).float(), torch.float32)
    assert sent.dtype == torch.int16 and int(sent[0]) == 299
    soft = torch.softmax(torch.randn(4, 10), -1)
    sent, targets = encode_teacher(soft, torch.float16)
    assert sent.dtype == torch.float16 and torch.equal(targets, soft.half().float())


@pytest.mark.parametrize("config, flags, up, down", [
    ("digits_fedgo.yaml", ["--aggregator.upload", "parameters"], "discriminator/0.weight", None),
    ("digits_lkd.yaml", ["--aggregator.scoring", "server", "--aggregator.server_labelled_size", "40"],
     "lkd_logits", "lkd_labelled_inputs"),
])
def test_alternative_upload_modes_are_counted(config, flags, up, down, tmp_path):
    argv = ["--config", config, "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", "1", "--federation.private_epochs_first", "1",
            "--federation.public_epochs_first", "0", "--data.num_clients", "4", "--data.classes_per_client", "3",
            "--data.public_size", "150", *flags]
    experiment = Experiment(parse_fit(argv)[1])
    loop = experiment.loop
    experiment.fit()
    kinds = {(m.direction, m.kind): m for m in loop.server_side.ledger.messages}
    assert ("up", up) in kinds
    if down:
        assert kinds[("down", down)].shape[0] == 40
