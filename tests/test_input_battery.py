"""Inputs that used to be accepted silently or to fail badly: settings that contradict each other or
the data, quoted and huge numbers, and a run directory whose storage or lock file gives way.

Bad settings end with exit status 2 and one line that starts with the field and says what is
allowed, before any file is written; a write that fails says what the system said and what of
the run is intact.
"""

import errno
import os
import re
import shutil

import pytest
import torch
import yaml

from fdlit.cli import main
from fdlit.configuration.schema import parse_fit
from fdlit.federation.settings import FederationSettings
from fdlit.runs.checkpoint import config_fingerprint, load_checkpoint, save_checkpoint
from fdlit.runs.directory import CHECKPOINT, CONFIG, LOCK, read_jsonl
from fdlit.runs.experiment import Experiment

TINY = ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
        "--federation.rounds", "2", "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
        "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
        "--data.num_clients", "3", "--data.classes_per_client", "4", "--data.public_size", "100"]


def digits_test_size() -> int:
    parser, cfg = parse_fit(["--config", "digits.yaml"])
    data = parser.instantiate(cfg).data
    data.setup(cfg.seed)
    return len(data.test.y)


def refused(tmp_path, capsys, *args, files: dict[str, str] | None = None) -> str:
    """Run ``fit`` with ``args`` (FILE:<name> replaced by a YAML file with ``files[name]``); assert it
    is refused with exit 2 in one line and that no run directory was made; the line."""
    argv = []
    for arg in args:
        if arg.startswith("FILE:"):
            path = tmp_path / f"{arg[5:]}.yaml"
            path.write_text(files[arg[5:]])
            arg = str(path)
        argv.append(arg)
    capsys.readouterr()
    code = main(["fit", *TINY, "--logger.run_dir", str(tmp_path / "runs"), *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()
    return err.strip()


# ---------------------------------------------------------------------------------- contradicting settings
@pytest.mark.parametrize("flags,field,said", [
    (["--federation.participation.late_joiners", "1", "--federation.participation.join_round", "3"],
     "federation.participation.join_round", "the late joiners (client 2) join in round 3, after the last round "
     "(federation.rounds = 2), so they would never take part; allowed: join rounds in [1, 2]"),
    (["--federation.participation.join_rounds", "[1, 4, 2]"], "federation.participation.join_rounds",
     "client(s) 1 join in round(s) 4, after the last round (federation.rounds = 2)"),
])
def test_clients_that_join_after_the_last_round_are_refused(flags, field, said, tmp_path, capsys):
    line = refused(tmp_path, capsys, *flags)
    assert line.startswith(f"fdlit: error: {field}: "), line
    assert said in line, line


def test_late_joiners_within_the_rounds_are_accepted():
    parser, cfg = parse_fit([*TINY, "--federation.participation.late_joiners", "1",
                             "--federation.participation.join_round", "2"])
    loop = Experiment(cfg, parser).loop  # builds and checks everything that needs no data
    assert loop.settings.participation.joined(3) == [1, 1, 2]


def test_broadcasting_without_a_server_model_is_refused_naming_both_fields(tmp_path, capsys):
    line = refused(tmp_path, capsys, "--server.broadcast", "true")
    assert line.startswith("fdlit: error: server.broadcast: "), line
    assert "server.model is null" in line and "--server.model" in line, line


@pytest.mark.parametrize("flags,field,works_with", [
    (["--privacy.top_k", "3"], "privacy.top_k", "privacy.encoding top_k"),
    (["--privacy.top_k", "2", "--privacy.encoding", "hard", "--aggregator.upload", "scores"], "privacy.top_k",
     "privacy.encoding top_k"),
    (["--privacy.bits", "4"], "privacy.bits", "privacy.encoding quantised"),
])
def test_an_encoding_knob_with_an_encoding_it_does_nothing_in_is_refused(flags, field, works_with, tmp_path,
                                                                          capsys):
    line = refused(tmp_path, capsys, *flags)
    assert line.startswith(f"fdlit: error: {field}: applies to {works_with} only, and privacy.encoding is "), line


def test_an_evaluation_subsample_larger_than_the_test_set_is_refused_with_both_numbers(tmp_path, capsys):
    size = digits_test_size()
    line = refused(tmp_path, capsys, "--federation.eval_subsample", str(size + 1))
    assert line == (f"fdlit: error: federation.eval_subsample: allowed: an integer in [1, {size}] (the test set's "
                    f"size) or null (the whole test set); got {size + 1}")
    settings = FederationSettings(eval_subsample=size)
    settings.check_test_set(size)  # the whole test set, named by its size: allowed


# ---------------------------------------------------------------------------------- numbers
QUOTED = """federation:
  rounds: '3'
  eval_subsample: "50"
client:
  lr: "1e-3"
aggregator:
  class_path: fdlit.methods.SmoothedUncertaintyWeighted
  init_args:
    tau: "0.5"
"""
PLAIN = QUOTED.replace("'3'", "3").replace('"50"', "50").replace('"1e-3"', "0.001").replace('"0.5"', "0.5")


def test_a_quoted_number_is_read_as_the_number(tmp_path):
    (tmp_path / "quoted.yaml").write_text(QUOTED)
    (tmp_path / "plain.yaml").write_text(PLAIN)
    configs = []
    for name in ("quoted", "plain"):
        parser, cfg = parse_fit([*TINY, "--config", str(tmp_path / f"{name}.yaml")])
        configs.append(yaml.safe_load(parser.dump(cfg)))
    assert configs[0] == configs[1]
    assert configs[0]["federation"]["rounds"] == 3 and configs[0]["aggregator"]["init_args"]["tau"] == 0.5


@pytest.mark.parametrize("text,field,allowed", [
    ("federation: {rounds: 'three'}", "federation.rounds", "allowed: an integer; got 'three'"),
    ("federation: {eval_subsample: ten}", "federation.eval_subsample", "allowed: an integer or null; got 'ten'"),
    ("privacy: {epsilon_budget: lots}", "privacy.epsilon_budget", "allowed: a number or null; got 'lots'"),
    ("federation: {compile: maybe}", "federation.compile", "allowed: true or false; got 'maybe'"),
    ("federation: {participation: {join_rounds: [a, 1, 1]}}", "federation.participation.join_rounds",
     "allowed: a list of integers or null; got ['a', 1, 1]"),
    ("aggregator: {class_path: fdlit.methods.SmoothedUncertaintyWeighted, init_args: {tau: hot}}",
     "aggregator.tau", "allowed: a number; got 'hot'"),
])
def test_a_text_that_is_no_number_is_refused_naming_the_field_and_the_type(text, field, allowed, tmp_path,
                                                                            capsys):
    line = refused(tmp_path, capsys, "--config", "FILE:bad", files={"bad": text})
    assert line == f"fdlit: error: {field}: {allowed}", line


@pytest.mark.parametrize("flags,field,allowed", [
    (["--aggregator.tau", "1e308"], "aggregator.tau", "[0, 1e+06]"),
    (["--aggregator.tau", "1e7"], "aggregator.tau", "[0, 1e+06]"),
    (["--aggregator", "fdlit.methods.LogitAveraging", "--aggregator.temperature", "1e-300"],
     "aggregator.temperature", "[1e-06, 1e+06]"),
    (["--aggregator", "fdlit.methods.LKD", "--aggregator.temperature", "1e300"], "aggregator.temperature",
     "[1e-06, 1e+06]"),
])
def test_a_temperature_that_overflows_float32_is_refused_with_its_range(flags, field, allowed, tmp_path, capsys):
    line = refused(tmp_path, capsys, *flags)
    assert line.startswith(f"fdlit: error: {field}: allowed: a finite number in {allowed}"), line


def test_the_ends_of_the_temperature_ranges_are_accepted():
    for flags in (["--aggregator.tau", "1e6"], ["--aggregator.tau", "0"],
                  ["--aggregator", "fdlit.methods.LogitAveraging", "--aggregator.temperature", "1e-6"]):
        parser, cfg = parse_fit([*TINY, *flags])
        Experiment(cfg, parser)


# ---------------------------------------------------------------------------------- storage giving way
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    parent = tmp_path_factory.mktemp("finished")
    assert main(["fit", *TINY, "--logger.run_dir", str(parent / "runs")]) == 0
    (run,) = (parent / "runs").iterdir()
    return run


class FullDisk:
    """A file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


@pytest.mark.parametrize("room", [0, 4096], ids=["first-write", "mid-file"])
def test_a_disk_full_during_the_checkpoint_write_says_so_and_that_the_last_one_is_intact(room, tmp_path, capsys,
                                                                                         monkeypatch):
    real, raised = torch.save, []

    def save(obj, f, *args, **kwargs):
        if not raised:  # round 1's checkpoint is written, round 2's meets a full disk
            raised.append(None)
            return real(obj, f, *args, **kwargs)
        try:
            return real(obj, FullDisk(f, room), *args, **kwargs)
        except BaseException as exc:
            raised.append(type(exc))
            raise

    monkeypatch.setattr(torch, "save", save)
    assert main(["fit", *TINY, "--logger.run_dir", str(tmp_path / "runs")]) == 1
    # torch's own error: an OSError when the first write fails, its zip writer's RuntimeError later on
    assert raised[1] is (OSError if room == 0 else RuntimeError)
    (run,) = (tmp_path / "runs").iterdir()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == (f"fdlit: stopped: No space left on device: {run / CHECKPOINT}; run directory {run}: the "
                        f"checkpoint of round 1 is intact; continue with: python -m fdlit fit --resume {run}")
    assert load_checkpoint(run)["loop"]["round"] == 1
    assert not list(run.glob("*.tmp"))


@pytest.mark.parametrize("what", ["folder", "link", "pipe"])
def test_a_lock_file_that_is_no_file_is_named_and_the_intact_checkpoint_resumes(what, finished_run, tmp_path, capsys):
    run = tmp_path / finished_run.name
    shutil.copytree(finished_run, run)
    lock = run / LOCK
    lock.unlink()
    outside = tmp_path / "elsewhere.txt"
    {"folder": lock.mkdir, "link": lambda: lock.symlink_to(outside), "pipe": lambda: os.mkfifo(lock)}[what]()
    capsys.readouterr()
    assert main(["fit", "--resume", str(run), "--federation.rounds", "3"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    described = {"folder": "a folder", "link": "a link", "pipe": "not a regular file (a pipe, socket or device)"}
    assert lines[0] == (f"fdlit: error: resume: {lock} is {described[what]}, not fdlit's lock file (fdlit writes it "
                        "as a plain file); remove it; the checkpoint of round 2 is intact; continue with: "
                        f"python -m fdlit fit --resume {run}")
    assert not outside.exists()  # nothing was written through the link
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]  # the run as it was
    lock.rmdir() if what == "folder" else lock.unlink()
    assert main(["fit", "--resume", str(run), "--federation.rounds", "3"]) == 0
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]


def test_the_stopped_line_counts_the_completed_rounds_when_no_checkpoint_could_be_written(tmp_path, capsys,
                                                                                            monkeypatch):
    def save(obj, f, *args, **kwargs):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(torch, "save", save)
    assert main(["fit", *TINY, "--logger.run_dir", str(tmp_path / "runs")]) == 1
    (run,) = (tmp_path / "runs").iterdir()
    rounds = [r["round"] for r in read_jsonl(run / "metrics.jsonl")]
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(
        rf"fdlit: stopped: File too large \(the process's file size limit, `ulimit -f`, was reached\): "
        rf"{re.escape(str(run / CHECKPOINT))}; run directory {re.escape(str(run))}: rounds 1 to {rounds[-1]} "
        r"completed \(metrics.jsonl holds them\) but no checkpoint was written, so there is nothing to resume "
        r"from; start the run again", line), line
    assert rounds and not (run / CHECKPOINT).exists()


def test_a_run_saved_with_a_knob_that_does_nothing_resumes_as_the_same_run(finished_run, tmp_path, capsys):
    """Saved before such settings were refused: privacy.top_k 3 with the full encoding, its checkpoint
    written for that config. It resumes with privacy.top_k 1, which is the same run."""
    run = tmp_path / finished_run.name
    shutil.copytree(finished_run, run)
    config = run / CONFIG
    assert config.read_text().count("  top_k: 1\n") == 1
    config.write_text(config.read_text().replace("  top_k: 1\n", "  top_k: 3\n"))
    _, cfg = parse_fit(["--config", str(config)])  # parsed only: the constructors would refuse it
    saved = cfg.clone().as_dict()
    saved.pop("config", None)
    state = torch.load(run / CHECKPOINT, weights_only=True)
    state.pop("sha256")
    state["config_sha256"] = config_fingerprint(saved)
    save_checkpoint(state, run / CHECKPOINT)
    capsys.readouterr()
    assert main(["fit", "--resume", str(run), "--federation.rounds", "3"]) == 0
    err = capsys.readouterr().err
    assert "fdlit: the run's privacy.top_k 3 does nothing in its settings (refused for new runs); it continues " \
           "with 1, the same run" in err
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    assert yaml.safe_load(config.read_text())["privacy"]["top_k"] == 1  # and the next resume needs no reset
    assert main(["fit", "--resume", str(run), "--federation.rounds", "4"]) == 0
    assert "does nothing" not in capsys.readouterr().err
