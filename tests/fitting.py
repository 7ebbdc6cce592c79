"""Shared helpers for tests that fit tiny federations (not a test module: tests import these instead of
importing each other). Fixtures live in conftest.py."""

import json
from pathlib import Path

from fdlit.cli import main
from fdlit.config import parse_fit
from fdlit.runs import read_jsonl
from fdlit.runs.experiment import Experiment

RULES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "configs").glob("digits*.yaml"))
EXECUTORS = {
    "sequential": "fdlit.execution.SequentialExecutor",
    "vectorized": "fdlit.execution.VectorizedExecutor",
    "ray": "fdlit.execution.RayExecutor",
}


def tiny(config, tmp_path, *extra, rounds=2):
    """``fit`` arguments for a two-round, four-client MLP federation of ``config`` writing into ``tmp_path``."""
    return ["--config", config, "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", str(rounds),
            "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
            "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "120",
            "--model", "fdlit.models.MLP", "--model.hidden", "[16]", *extra]


def fit_loop(argv):
    parser, cfg = parse_fit(argv)
    loop = Experiment(cfg, parser).loop
    loop.fit()
    return loop


def executor_flags(executor):
    extra = ["--federation.executor", EXECUTORS[executor]]
    return extra + (["--federation.executor.actor_executor", "sequential"] if executor == "ray" else [])


def ledger_rows(loop):
    return [(m.round, m.client, m.direction, m.kind, m.shape, m.bytes) for m in loop.server_side.ledger.messages]


def without_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def only_run(parent: Path) -> Path:
    (run,) = [p for p in parent.iterdir() if p.is_dir()]
    return run


def stopped_and_resumed_equals_straight(rule, tmp_path, *flags) -> tuple[list, list]:
    """Run ``rule`` with ``flags`` stopped after round 1 and resumed to round 2 next to the run already made
    in ``tmp_path/straight``; assert metrics (timings aside), ledger and summary bytes equal; return them."""
    assert main(["fit", *tiny(rule, tmp_path / "stopped", *flags, "--federation.rounds", "1")]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "2"]) == 0
    straight = only_run(tmp_path / "straight")
    resumed, uninterrupted = (without_time(read_jsonl(p / "metrics.jsonl")) for p in (stopped, straight))
    assert resumed == uninterrupted and len(resumed) == 2
    ledger = read_jsonl(straight / "communication.jsonl")
    assert ledger == read_jsonl(stopped / "communication.jsonl")
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["finished"] and summary["bytes_up_total"] == json.loads(
        (straight / "summary.json").read_text())["bytes_up_total"]
    return resumed, ledger
