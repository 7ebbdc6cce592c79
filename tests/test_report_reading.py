"""Readers of a run folder read only what a run writes: regular files of the folder, each within a
size cap, lines within a length cap; anything else is refused at once in one line naming the file."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fdlit.runs.directory as directory
from fdlit.errors import ConfigError
from fdlit.reporting import load_runs, write_report
from fdlit.runs.checkpoint import load_checkpoint
from fdlit.runs.directory import RunFileError, read_config, read_jsonl
from tests.fake_runs import fake_run

REPO = Path(__file__).resolve().parents[1]
PNG = ("png",)


def two_runs(root):
    good = fake_run(root, "AVG", 2, 0, 0.3)
    bad = fake_run(root, "AVG", 2, 1, 0.4)
    return good, bad


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this system")
def test_metrics_linked_to_dev_zero_is_refused_at_once_not_read_forever(tmp_path):
    root = tmp_path / "runs"
    _, bad = two_runs(root)
    (bad / "metrics.jsonl").unlink()
    (bad / "metrics.jsonl").symlink_to("/dev/zero")
    code = "import sys; from fdlit.cli import main; sys.exit(main(['report', sys.argv[1], '--formats', '[png]']))"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, str(root)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - start < 60
    said = done.stdout.splitlines()[0]
    assert said.startswith("fdlit report: 1 run(s) used, 1 left out: ") and "metrics.jsonl is a link to a file " \
        "outside its run folder" in said, said
    assert "1 run(s) left out" in (root / "report" / "index.html").read_text()


def test_a_pipe_a_folder_and_links_out_of_the_run_are_refused_naming_the_file(tmp_path):
    root = tmp_path / "runs"
    runs = [fake_run(root, "AVG", 2, seed, 0.3) for seed in range(5)]
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text((runs[1] / "config.yaml").read_text())
    (runs[1] / "config.yaml").unlink()
    (runs[1] / "config.yaml").symlink_to(outside)
    (runs[2] / "summary.json").unlink()
    os.mkfifo(runs[2] / "summary.json")  # a reader that opened it would wait for a writer forever
    (runs[3] / "metrics.jsonl").rename(runs[3] / "metrics.real")
    (runs[3] / "metrics.jsonl").symlink_to("metrics.real")  # a link inside the run folder is read
    (runs[4] / "summary.json").unlink()
    (runs[4] / "summary.json").mkdir()
    used, skipped = load_runs(root)
    assert sorted(r.path for r in used) == [runs[0], runs[3]]
    reasons = dict(skipped)
    assert reasons[runs[1]] == "config.yaml is a link to a file outside its run folder; fdlit reads only the run's " \
                               "own files"
    assert reasons[runs[2]] == "summary.json is not a regular file (a device, pipe, socket or folder)"
    assert reasons[runs[4]] == "summary.json is not a regular file (a device, pipe, socket or folder)"


def test_a_file_or_line_over_its_cap_is_refused_in_one_line(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    good, bad = two_runs(root)
    monkeypatch.setitem(directory.SIZE_LIMITS, "metrics.jsonl", 2**20)
    (bad / "metrics.jsonl").write_text((bad / "metrics.jsonl").read_text() + " " * 2**20 + "\n")
    used, skipped = load_runs(root)
    assert [r.path for r in used] == [good]
    assert skipped == [(bad, "metrics.jsonl is larger than 1 MiB, the most fdlit reads of it")]
    monkeypatch.setitem(directory.SIZE_LIMITS, "metrics.jsonl", 8 * 2**20)
    monkeypatch.setattr(directory, "MAX_LINE", 2**20)
    (bad / "metrics.jsonl").write_text('{"round": 1, "x": "' + "y" * (2**20 + 1) + '"}\n')
    assert dict(load_runs(root)[1])[bad] == "metrics.jsonl has a line longer than 1 MiB, the most fdlit reads of one line"
    with pytest.raises(RunFileError) as refused:
        read_jsonl(bad / "metrics.jsonl")
    assert str(refused.value) == f"run_dir: {bad / 'metrics.jsonl'} has a line longer than 1 MiB, the most fdlit " \
                                 "reads of one line"


def test_a_config_of_nested_yaml_aliases_is_refused_not_expanded(tmp_path):
    root = tmp_path / "runs"
    good, bad = two_runs(root)
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]  # 10^9 values once expanded
    (bad / "config.yaml").write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    with pytest.raises(RunFileError, match="expands to more than 1000000 values"):
        read_config(bad)
    used, skipped = load_runs(root)
    assert time.monotonic() - start < 30 and [r.path for r in used] == [good] and skipped[0][0] == bad


def test_when_every_run_is_refused_the_error_says_why(tmp_path):
    root = tmp_path / "runs"
    run = fake_run(root, "AVG", 2, 0, 0.3)
    (tmp_path / "summary.json").write_text((run / "summary.json").read_text())
    (run / "summary.json").unlink()
    (run / "summary.json").symlink_to(tmp_path / "summary.json")
    with pytest.raises(ConfigError, match="left out: .*summary.json is a link to a file outside its run folder"):
        write_report(root, formats=PNG)
    assert not (root / "report").exists()


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this system")
def test_a_checkpoint_linked_to_a_device_is_refused_unread(tmp_path):
    run = fake_run(tmp_path / "runs", "AVG", 2, 0, 0.3)
    (run / "checkpoint.pt").symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="checkpoint.pt is a link to a file outside its run folder"):
        load_checkpoint(run)
