"""Trusting bytes on disk: checksummed checkpoints, write failures in one line, strict JSON, and
one sweep per folder at a time."""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from damage import flip_tensor_bytes

from fdlit.cli import main
from fdlit.clients import ClientModule  # noqa: F401 (imported up front, as a run does: Lightning takes seconds)
from fdlit.runs.checkpoint import load_checkpoint, resume_hint
from fdlit.runs.directory import CHECKPOINT

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}


def strict_load(text):
    """json.loads that refuses NaN and Infinity, as every other JSON reader does."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def only_run(parent: Path) -> Path:
    (run,) = [p for p in Path(parent).iterdir() if p.is_dir()]
    return run


@pytest.fixture
def kept_run(fast_args, tmp_path):
    """A finished 3-round run that keeps the checkpoints of rounds 1-3."""
    assert main(["fit", *fast_args, "--federation.rounds", "3", "--checkpoint.keep", "3"]) == 0
    return only_run(tmp_path / "runs")


# ---------------------------------------------------------------------------------- checksums
def test_a_flipped_checkpoint_is_refused_naming_it_and_the_newest_intact_kept_one(kept_run, capsys):
    run = kept_run
    flip_tensor_bytes(run / CHECKPOINT)  # checkpoint-r3.pt is a hard link: damaged too
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["fit", "--resume", str(run), "--federation.rounds", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"fdlit: error: resume: {run / CHECKPOINT} is damaged"), err
    assert err[0].endswith(f"round 2's; continue from it with: python -m fdlit fit --resume {run / 'checkpoint-r2.pt'}")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing changed

    # the offered command resumes from round 2 and rewrites the damaged checkpoint
    assert main(["fit", "--resume", str(run / "checkpoint-r2.pt"), "--federation.rounds", "4"]) == 0
    assert load_checkpoint(run)["loop"]["round"] == 4
    assert [strict_load(line)["round"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def test_the_stop_message_calls_a_checkpoint_intact_only_after_verifying_it(kept_run):
    assert resume_hint(kept_run, 3).startswith("the checkpoint of round 3 is intact")
    flip_tensor_bytes(kept_run / CHECKPOINT)
    hint = resume_hint(kept_run, 3)
    assert "intact" not in hint.split(";")[0] and "is damaged" in hint
    assert hint.endswith(f"--resume {kept_run / 'checkpoint-r2.pt'}")
    for _, kept in [(1, kept_run / "checkpoint-r1.pt"), (2, kept_run / "checkpoint-r2.pt")]:
        flip_tensor_bytes(kept)
    assert resume_hint(kept_run, 3).endswith("no intact earlier checkpoint is kept (checkpoint.keep); "
                                             "start the run again")


def test_a_checkpoint_round_trips_with_its_checksum_and_any_changed_value_is_caught(kept_run):
    from fdlit.runs.checkpoint import content_digest

    state = torch.load(kept_run / CHECKPOINT, weights_only=True)
    written = state.pop("sha256")
    assert written == content_digest(state)
    state["loop"]["round"] = 2  # a plain value, not a tensor
    assert content_digest(state) != written


# ---------------------------------------------------------------------------------- write failures
def test_torchs_container_error_in_the_background_writer_ends_in_one_line(fast_args, tmp_path, capsys, monkeypatch):
    real, calls = torch.save, []

    def save(obj, f, *a, **k):
        calls.append(1)
        if len(calls) == 2:  # what torch raises when the disk fills mid-file
            f.write(b"part of a checkpoint")
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4608 vs 4496")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    assert main(["fit", *fast_args]) == 1
    run = only_run(tmp_path / "runs")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fdlit: stopped: Input/output error (writing the checkpoint failed: [enforce fail")
    assert lines[0].endswith(f"the checkpoint of round 1 is intact; continue with: python -m fdlit fit --resume {run}")
    assert not list(run.glob("*.tmp"))


def test_a_real_file_size_limit_during_the_checkpoint_write_ends_in_one_line(fast_args, tmp_path):
    """A real failing write (RLIMIT_FSIZE: writes past the limit fail with EFBIG, as on a full
    disk), in the background writer of a separate process: one line and the resume command."""
    limit = 64 * 1024  # the config and logs fit; a checkpoint (about 500 KB here) does not

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "fdlit", "fit", *fast_args], cwd=REPO, env=ENV, text=True,
                          capture_output=True, preexec_fn=limited, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(lines) == 1, lines
    run = only_run(tmp_path / "runs")
    rounds = [json.loads(line)["round"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2]  # both rounds ran (round 1's checkpoint fails in the background, raised after round 2)
    assert lines[0] == (f"fdlit: stopped: File too large (the process's file size limit, `ulimit -f`, was reached): "
                        f"{run / CHECKPOINT}; run directory {run}: rounds 1 to {rounds[-1]} completed (metrics.jsonl "
                        "holds them) but no checkpoint was written, so there is nothing to resume from; start the run "
                        "again")
    assert not list((tmp_path / "runs").glob("*/*.tmp"))


# ---------------------------------------------------------------------------------- strict JSON
def test_strict_json_writes_null_for_nan_and_inf_at_any_depth():
    import numpy as np

    from fdlit.runs import strict_json

    text = strict_json.dumps({"a": float("nan"), "b": [1.0, float("inf"), {"c": -float("inf")}],
                              "d": np.float32("nan"), "e": torch.tensor(float("nan")), "f": 0.5})
    assert strict_load(text) == {"a": None, "b": [1.0, None, {"c": None}], "d": None, "e": None, "f": 0.5}


def test_every_json_file_of_a_run_and_a_sweep_is_strict(fast_args, tmp_path):
    # dropout drops most uploads: rounds without a teacher have NaN teacher metrics
    args = [*fast_args, "--federation.participation.dropout", "0.9", "--federation.rounds", "2", "--seed", "1"]
    assert main(["fit", *args]) == 0
    run = only_run(tmp_path / "runs")
    summary = (run / "summary.json").read_text()
    strict_load(summary)
    assert "null" in summary  # there was a non-finite value, and it became null
    for name in ("metrics.jsonl", "communication.jsonl"):
        for line in (run / name).read_text().splitlines():
            strict_load(line)
    strict_load((run / "run.lock").read_text())


# ---------------------------------------------------------------------------------- sweeps
def tiny_sweep(folder: Path, seeds=(0, 1)) -> Path:
    spec = {"name": "twice", "method": "grid", "parameters": {"seed": {"values": list(seeds)}},
            "command": ["python", "-m", "fdlit", "fit", "--config", "digits.yaml", "${args}"]}
    path = folder / "twice.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


SWEEP_FLAGS = ["--logger.mode", "disabled", "--logger.progress", "false", "--federation.rounds", "1",
               "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
               "--data.num_clients", "3", "--data.classes_per_client", "4", "--data.public_size", "100"]


def test_two_identical_sweeps_on_one_folder_run_nothing_twice_and_lose_no_record(tmp_path):
    sweep = tiny_sweep(tmp_path, seeds=(0, 1, 2))
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "fdlit", "sweep", str(sweep), "--", *SWEEP_FLAGS, "--logger.run_dir", str(runs)]
    first = subprocess.Popen(cmd, cwd=REPO, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (runs / ".sweep" / "sweep-twice.lock").exists() or not (runs / ".sweep" / "sweep-twice.lock").read_text():
        assert first.poll() is None and time.time() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.05)
    second = subprocess.run(cmd, cwd=REPO, env=ENV, text=True, capture_output=True, timeout=300)
    first_running = first.poll() is None
    assert first.wait(timeout=500) == 0, first.communicate()[1][-3000:]
    if first_running:  # the second one, refused in one line naming the first
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stderr.startswith("fdlit: error: sweep: this sweep is already running on ")
        assert len(second.stderr.strip().splitlines()) == 1 and f"pid {first.pid}" in second.stderr
    else:  # the first one ended before: the second finds every run finished and skips them
        assert second.returncode == 0, second.stderr[-3000:]
    assert sorted(p.name.split("-", 3)[-1] for p in runs.iterdir() if p.is_dir() and p.name != ".sweep") == [
        "twice-seed0", "twice-seed1", "twice-seed2"]  # every combination ran exactly once
    records = strict_load((runs / ".sweep" / "sweep-twice.json").read_text())["runs"]
    assert sorted(r["name"] for r in records) == ["twice-seed0", "twice-seed1", "twice-seed2"]
    assert all(r["status"] == "finished" for r in records)


def test_a_sweep_held_by_another_process_is_refused_in_one_line_and_keeps_earlier_records(tmp_path, capsys):
    from fdlit.runs.directory import RunLock
    from fdlit.sweeps.controller import SweepInUse

    runs = tmp_path / "runs"
    sweep = tiny_sweep(tmp_path, seeds=(0,))
    argv = ["sweep", str(sweep), "--", *SWEEP_FLAGS, "--logger.run_dir", str(runs)]
    assert main(argv) == 0
    results = runs / ".sweep" / "sweep-twice.json"
    first = strict_load(results.read_text())["runs"]
    lock = RunLock(runs / ".sweep", "sweep-twice.lock", SweepInUse).acquire()
    try:
        capsys.readouterr()
        before = results.read_bytes()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fdlit: error: sweep: this sweep is already running on {runs}")
        assert results.read_bytes() == before
    finally:
        lock.release()
    # the sweep grows a seed: the earlier record stays, the new one joins it
    sweep = tiny_sweep(tmp_path, seeds=(0, 1))
    assert main(argv) == 0
    records = strict_load(results.read_text())["runs"]
    assert [r["name"] for r in records] == ["twice-seed0", "twice-seed1"]
    assert records[0]["run_dir"] == first[0]["run_dir"]


# ---------------------------------------------------------------------------------- config-only checks
CONFIG_ONLY = [
    (["--federation.participation.count", "21", "--data.num_clients", "20"], "federation.participation.count"),
    (["--aggregator", "fdlit.methods.F2L", "--aggregator.regions", "30"], "aggregator.regions"),
    (["--aggregator", "fdlit.methods.F2LParams", "--aggregator.regions", "[0, 1]"], "aggregator.regions"),
    (["--federation.participation.join_rounds", "[3, 3, 3, 3, 3, 3, 3, 3, 3, 3]", "--data.num_clients", "10",
      "--federation.rounds", "2"], "federation.participation.join_rounds"),
    (["--federation.participation.public_subset", "501"], "federation.participation.public_subset"),
    (["--aggregator.upload", "scores", "--privacy.encoding", "top_k", "--privacy.top_k", "11"], "privacy.top_k"),
]


@pytest.mark.parametrize("args,field", CONFIG_ONLY, ids=[c[1] + str(i) for i, c in enumerate(CONFIG_ONLY)])
def test_settings_the_config_shows_impossible_stop_before_any_data_loads(args, field, tmp_path, capsys, monkeypatch):
    from fdlit.data import FederatedData

    def no_data(self, seed):
        raise AssertionError("the dataset was loaded")

    monkeypatch.setattr(FederatedData, "setup", no_data)
    start = time.perf_counter()
    code = main(["fit", "--config", "digits.yaml", "--logger.mode", "disabled", "--logger.run_dir",
                 str(tmp_path / "runs"), *args])
    took = time.perf_counter() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith(f"fdlit: error: {field}: "), err
    assert took < 2.0
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------- report warnings
def test_a_plotting_warning_during_the_report_is_one_line_without_source(tmp_path, capsys, monkeypatch):
    import fdlit.reporting

    def draws_an_empty_legend(runs, out, **kwargs):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.legend()  # matplotlib: "No artists with labels found to put in legend. ..."
        ax.legend()
        plt.close(fig)
        return Path(out) / "index.html"

    monkeypatch.setattr(fdlit.reporting, "write_report", draws_an_empty_legend)
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit report: warning: No artists with labels found"), err
