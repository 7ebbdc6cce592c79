"""What the terminal shows: client progress inside a phase, and the wall time including start-up."""

import io
import re
import sys
import time

from fdlit.callbacks import FederationCallback
from fdlit.cli import main
from fdlit.configuration.schema import parse_fit
from fdlit.execution import SequentialExecutor
from fdlit.runs.experiment import Experiment


def tiny(tmp_path, *extra):
    return ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path / "runs"), "--federation.rounds", "1",
            "--federation.private_epochs_first", "3", "--federation.public_epochs_first", "1",
            "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "120",
            "--model", "fdlit.models.MLP", "--model.hidden", "[16]", *extra]


class Record(FederationCallback):
    def __init__(self):
        self.calls = []

    def on_clients_progress(self, loop, phase, done, total):
        self.calls.append((phase, done, total))


def progress_of(tmp_path, executor):
    parser, cfg = parse_fit(tiny(tmp_path, "--federation.executor", executor))
    experiment = Experiment(cfg, parser)
    record = Record()
    experiment.loop.callbacks.append(record)
    experiment.fit()
    return [(d, t) for p, d, t in record.calls if p == "private"]


def test_sequential_progress_advances_client_by_client(tmp_path):
    assert progress_of(tmp_path, "fdlit.execution.SequentialExecutor") == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_vectorized_progress_advances_inside_the_phase(tmp_path):
    private = progress_of(tmp_path, "fdlit.execution.VectorizedExecutor")
    done = [d for d, _ in private]
    assert done[-1] == 4 and all(t == 4 for _, t in private)
    assert len(done) >= 3 and 0 < done[0] < 4  # per epoch of the chunk (3 epochs), not 0 -> 4 at the end
    assert done == sorted(done)


class SlowStart(SequentialExecutor):
    def setup(self, fabric, clients):
        time.sleep(1.5)  # what starting workers (e.g. Ray) costs
        super().setup(fabric, clients)


def test_wall_time_includes_executor_start_up(tmp_path):
    parser, cfg = parse_fit(tiny(tmp_path))
    experiment = Experiment(cfg, parser)
    experiment.loop.settings.executor = SlowStart()
    start = time.perf_counter()
    summary = experiment.fit()
    took = time.perf_counter() - start
    assert 1.5 <= summary["wall_time_s"] <= took


class Terminal(io.StringIO):
    """What a terminal is to the progress bar: a stream that says it is a TTY."""

    def isatty(self):
        return True


def test_progress_bars_on_a_terminal_and_summary_last(tmp_path, capfd, monkeypatch):
    args = tiny(tmp_path, "--federation.executor", "fdlit.execution.SequentialExecutor", "--federation.rounds", "2")
    args[args.index("--logger.progress") + 1] = "true"
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["fit", *args]) == 0
    shown = terminal.getvalue()
    assert "round 1 private" in shown and "4/4" in shown and "\r" in shown  # bars, redrawn in place
    assert "round 1/2:" not in shown
    assert "fdlit summary" in capfd.readouterr().out


def test_one_plain_line_per_round_when_not_on_a_terminal(tmp_path, capfd):
    args = tiny(tmp_path, "--federation.executor", "fdlit.execution.SequentialExecutor", "--federation.rounds", "2")
    args[args.index("--logger.progress") + 1] = "true"
    assert main(["fit", *args]) == 0
    captured = capfd.readouterr()
    for text in (captured.err, captured.out):
        assert "\x1b" not in text and "\r" not in text  # no escape codes, no redraws
    lines = [line for line in captured.err.splitlines() if line.startswith("round ")]
    assert len(lines) == 2 and lines[0].startswith("round 1/2: acc 0.") and lines[1].startswith("round 2/2: acc ")
    assert re.fullmatch(r"round 2/2: acc [01]\.\d{3}, local [01]\.\d{3}, teacher [01]\.\d{3} \(\d+\.\d s\)", lines[1])
    assert "fdlit summary" in captured.out
