"""The printed summary says what each number is measured on, and prints no ``nan`` as a result."""

import re

import pytest

from fdlit.cli import main
from fdlit.federation import format_summary


def tiny(tmp_path, config, *extra):
    return ["fit", "--config", config, "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", "3", "--federation.private_epochs_first", "1",
            "--federation.private_epochs", "1", "--federation.public_epochs_first", "1",
            "--federation.public_epochs", "1", "--data.num_clients", "5", "--data.public_size", "120", *extra]


@pytest.mark.parametrize("config", ["digits_fedavg.yaml", "digits.yaml"])
def test_each_number_says_its_test_samples_and_fedavg_has_no_teacher(tmp_path, capsys, config):
    assert main(tiny(tmp_path, config, "--federation.eval_subsample", "100", "--data.validation_size", "50")) == 0
    out = capsys.readouterr().out
    text = out[out.index("fdlit summary:"):]
    assert "nan" not in text.lower()
    full = re.search(r"final mean local accuracy : .*on all (\d+) test samples", text)
    assert full, text
    for label in ("best mean global accuracy", "validation-selected"):
        line = next(line for line in text.splitlines() if line.strip().startswith(label))
        # both phases name their samples: the subsample (with the flag that set it) or the whole set
        measured = re.findall(r"on (?:100 of \d+ test samples \(federation.eval_subsample\)|all \d+ test samples)", line)
        assert len(measured) == 2, line
    teacher = next(line for line in text.splitlines() if "final teacher accuracy" in line)
    if config == "digits_fedavg.yaml":
        assert teacher.endswith("no teacher (this run sends no predictions on the public set)")
    else:
        assert re.search(r": 0\.\d{4} \(on the public set's labels", teacher)


def test_a_summary_read_back_from_json_with_nulls_prints_no_nan():
    summary = {"run": "r", "run_dir": "d", "rounds": 2, "wall_time_s": 1.0, "best_global_acc_mean": 0.5,
               "best_round": 2, "best_global_acc_mean_after_private": float("nan"), "best_round_after_private": 1,
               "final_round": 2, "final_local_acc_mean_after_private": None, "final_local_acc_mean_after_public": 0.9,
               "final_teacher_acc": None, "bytes_up_total": 0, "bytes_down_total": 0, "best_test_samples": 100,
               "final_test_samples": 359}
    text = format_summary(summary)
    assert "nan" not in text.lower() and "None" not in text
    assert "not measured after private phase" in text and "no teacher" in text
    assert "0.5000 after public phase (round 2, on 100 of 359 test samples (federation.eval_subsample))" in text
