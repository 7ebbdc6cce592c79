"""A deployment's requests in one process: the FlowerExecutor talks to NodeWorkers through a Grid
that hands each message to its node at once (no Flower processes), so what the server sends a round
and what a node keeps on disk are checked in seconds; the real deployment is tests/test_deployment.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from fdlit.cli import main as cli_main

pytest.importorskip("flwr")

from fdlit.deployment.wire import unpack  # noqa: E402

ROUNDS = ["--federation.executor", "fdlit.execution.SequentialExecutor", "--logger.mode", "disabled",
          "--logger.progress", "false", "--data.num_clients", "6"]


@pytest.fixture(autouse=True)
def flower_task(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)  # what a ServerApp process has (Messages name their run)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


class InProcessGrid:
    """Flower's Grid as the FlowerExecutor uses it, with each node's worker in this process."""

    def __init__(self, nodes: int, node_config: dict | None = None):
        from fdlit.deployment.node import NodeWorker

        self.workers = {}
        for i in range(nodes):
            worker = NodeWorker()
            worker.stop, worker.node_config = False, {"partition-id": i, **(node_config or {})}
            self.workers[1000 + i] = worker
        self.replies: dict[str, object] = {}
        self.sent: list[tuple[str, int]] = []  # (op, node) of every message, in order

    def get_node_ids(self):
        return list(self.workers)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            node = m.metadata.dst_node_id
            self.sent.append((unpack(m.content)[0]["op"], node))
            ids.append(mid := f"m{len(self.sent)}")
            self.replies[mid] = self.workers[node].handle(m.content)
        return ids

    def pull_messages(self, ids):
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i), has_error=lambda: False,
                                content=self.replies.pop(i)) for i in ids if i in self.replies]


def deployed_in_process(args: list[str], grid: InProcessGrid, resume: str | None = None) -> Path:
    from fdlit.config import parse_fit
    from fdlit.deployment.executor import FlowerExecutor
    from fdlit.runs.experiment import Experiment, resume_experiment

    if resume:
        experiment = resume_experiment(resume, args)
    else:
        parser, cfg = parse_fit(args)
        experiment = Experiment(cfg, parser)
    executor = FlowerExecutor(grid, nodes=len(grid.workers), threads=1)
    experiment.loop.executor = executor
    executor.states_every = experiment.checkpoint.every_n_rounds
    executor.bind(experiment.loop, experiment.config_yaml)
    experiment.run()
    return experiment.run_path


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def close(a, b) -> bool:
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(b, float) and isinstance(a, (int, float)):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-5
    return a == b


def assert_equal_to_fit(deployed: list[dict], fitted: list[dict]) -> None:
    assert [d["round"] for d in deployed] == [f["round"] for f in fitted]
    for d, f in zip(deployed, fitted, strict=True):
        for key, value in f.items():
            if not key.startswith("time/"):
                assert close(d[key], value), (d["round"], key, d[key], value)


def test_parameter_exchange_takes_one_exchange_a_round_and_equals_fit(tmp_path):
    args = ["--config", "digits_fedavg.yaml", "--federation.rounds", "4", *ROUNDS]
    grid = InProcessGrid(3)
    deployed = metrics_of(deployed_in_process([*args, "--logger.run_dir", str(tmp_path / "d")], grid))
    assert cli_main(["fit", *args, "--logger.run_dir", str(tmp_path / "f")]) == 0
    assert_equal_to_fit(deployed, metrics_of(next((tmp_path / "f").iterdir())))
    # round 1: hello, the nodes' set-up, FedAvg's round 0, the step (it carries round 0's broadcast);
    # then one step a round, which carries the previous round's global model; the last round closes
    # with one request that loads it and measures; one message per node each time
    assert [d["comm/exchanges"] for d in deployed] == [4, 1, 1, 2]
    assert [d["comm/messages"] for d in deployed] == [12, 3, 3, 6]
    ops = [op for op, _ in grid.sent]
    assert ops.count("hook") == 3  # FedAvg's round-0 set-up only: no receive on its own
    assert ops.count("step") == 3 * 5
