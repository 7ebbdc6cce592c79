"""Messages that say what happened and what to do: a signed non-number value is checked, not taken
for a missing value; a full disk names the file; a stopped deploy counts the rounds its run folder
holds; reading a run's logs holds one line at a time, not the file."""

from __future__ import annotations

import errno
import os
import tracemalloc

import pytest

from fdlit.cli import main


@pytest.mark.parametrize("flag,value,expected", [
    ("--aggregator.tau", "-inf", "aggregator.tau: allowed: a number (infinity is not allowed); got '-inf'"),
    ("--seed", "-1e3", "seed: allowed: an integer; got '-1000.0'"),
])
def test_a_value_that_starts_with_a_minus_is_checked_as_a_value(flag, value, expected, tmp_path, capsys):
    assert main(["fit", "--config", "digits", flag, value, "--logger.run_dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"fdlit: error: {expected}"]
    assert not list(tmp_path.iterdir())


def test_a_full_disk_while_appending_a_log_names_the_file(tmp_path, monkeypatch):
    from fdlit.runs import directory

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")  # as the kernel reports it: no file

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as err:
        directory.append_jsonl(tmp_path / "metrics.jsonl", [{"round": 1}])
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "metrics.jsonl")


def test_a_stopped_deploy_counts_the_rounds_its_run_folder_holds(tmp_path):
    from fdlit.deployment.command import RunPlace

    runs = tmp_path / "runs"
    runs.mkdir()
    place = RunPlace(["--config", "x.yaml", f"--logger.run_dir={runs}"])
    run = runs / "20260101-000000-r"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    assert place.kept(None) == (f"kept: {run}: round 1 completed (metrics.jsonl holds them) but no checkpoint was "
                                "written, so there is nothing to continue from: run the config again to start anew")


def test_reading_a_log_with_one_huge_line_holds_far_less_than_the_file(tmp_path):
    from fdlit.runs.directory import MAX_LINE, RunFileError, read_jsonl

    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"round": 1}\n{"x": "' + b"a" * (4 * MAX_LINE) + b'"}\n')  # 64 MiB in one line
    tracemalloc.start()
    try:
        with pytest.raises(RunFileError, match="has a line longer than 16 MiB"):
            read_jsonl(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_LINE, peak  # about a line's cap (read into a buffer, then a copy), not the file (4x it)


def test_a_fit_stopped_before_its_first_checkpoint_says_which_rounds_completed(tmp_path, capsys, monkeypatch):
    from fdlit.runs import checkpoint

    def interrupted(self, loop, round, metrics):
        raise KeyboardInterrupt  # Ctrl-C after round 1's metrics were written, before its checkpoint

    monkeypatch.setattr(checkpoint.Checkpointer, "on_round_end", interrupted)
    code = main(["fit", "--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
                 "--logger.run_dir", str(tmp_path), "--federation.rounds", "2", "--data.num_clients", "4",
                 "--data.classes_per_client", "3", "--data.public_size", "100"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and len(err) == 1, err
    assert "round 1 completed (metrics.jsonl holds them) but no checkpoint was written" in err[0], err
