"""A deployment's requests in one process: the FlowerExecutor talks to NodeWorkers through a Grid
that hands each message to its node at once (no Flower processes), so what the server sends a round
and what a node keeps on disk are checked in seconds; the real deployment is tests/test_deployment.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from fdlit.cli import main as cli_main

pytest.importorskip("flwr")

from fdlit.deployment.wire import unpack  # noqa: E402
from tests.test_deployment import close, metrics_of  # noqa: E402

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

    def __init__(self, nodes: int, node_config: dict | None = None, die_at_step: int | None = None):
        from fdlit.deployment.node import NodeWorker

        self.workers = {}
        for i in range(nodes):
            worker = NodeWorker()
            worker.stop, worker.node_config = False, {"partition-id": i, **(node_config or {})}
            self.workers[1000 + i] = worker
        self.replies: dict[str, object] = {}
        self.sent: list[tuple[str, int]] = []  # (op, node) of every message, in order
        self.die_at_step = die_at_step  # the server "dies" sending its n-th step request

    def push_messages(self, messages):
        if [op for op, _ in self.sent].count("step") // len(self.workers) + 1 == self.die_at_step:
            self.die_at_step = None
            raise KeyboardInterrupt  # the ServerApp killed while it sends the request
        return self._push(messages)

    def get_node_ids(self):
        return list(self.workers)

    def _push(self, messages):
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
    from fdlit.configuration.schema import parse_fit
    from fdlit.deployment.executor import FlowerExecutor
    from fdlit.runs.experiment import Experiment, resume_experiment

    if resume:
        experiment = resume_experiment(resume, args)
    else:
        parser, cfg = parse_fit(args)
        experiment = Experiment(cfg, parser)
    executor = FlowerExecutor(grid, nodes=len(grid.workers), threads=1)
    experiment.loop.settings.executor = executor
    executor.states_every = experiment.checkpoint.every_n_rounds
    executor.bind(experiment.loop, experiment.config_yaml)
    experiment.run()
    return experiment.run_path


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


def test_nodes_keep_their_clients_checkpoints_and_a_killed_run_resumes_from_them(tmp_path, capsys):
    from fdlit.runs.checkpoint import load_checkpoint

    nodes = {"checkpoint-dir": str(tmp_path / "node-disk")}
    args = ["--config", "digits_fedavg.yaml", "--federation.rounds", "4", *ROUNDS]
    whole = metrics_of(deployed_in_process([*args, "--logger.run_dir", str(tmp_path / "whole")], InProcessGrid(3, nodes)))
    assert cli_main(["fit", *args, "--logger.run_dir", str(tmp_path / "f")]) == 0
    fitted = metrics_of(next((tmp_path / "f").iterdir()))
    assert_equal_to_fit(whole, fitted)
    # what a checkpointed round moves to the server besides the uploads: the evaluation bits, no states;
    # the states stay on the nodes' disks (each node's file of the round), except the last round's
    files = sorted((tmp_path / "node-disk").glob("*/round-*-clients-*.pt"))
    assert {p.name.split("-")[1] for p in files} == {"1", "2", "3"}  # the newest 3 rounds kept; round 4's came up
    states = sum(p.stat().st_size for p in files if p.name.startswith("round-2-"))
    beside_uploads = [d["comm/wire_up_bytes"] - d["comm/wire_upload_bytes"] for d in whole]
    assert max(beside_uploads[1:3]) < states / 10 < states < beside_uploads[3]

    # the ServerApp killed as it sends round 4's step: round 2 is checkpointed (round 3 closes with that step)
    with pytest.raises(KeyboardInterrupt):
        deployed_in_process([*args, "--logger.run_dir", str(tmp_path / "killed")], InProcessGrid(3, nodes, die_at_step=4))
    run_dir = next((tmp_path / "killed").iterdir())
    state = load_checkpoint(run_dir / "checkpoint.pt")
    saved_round = state["loop"]["round"]
    assert saved_round in (2, 3)
    # the server's checkpoint names the round each client's node saved, not the states
    assert all(set(s) == {"node_checkpoint"} and s["node_checkpoint"]["round"] == saved_round
               for s in state["loop"]["clients"])
    assert (run_dir / "checkpoint.pt").stat().st_size < states
    # fit cannot continue it: its client states are on the nodes (one line naming deploy --resume, exit 2)
    copy = tmp_path / "copy" / run_dir.name
    shutil.copytree(run_dir, copy)
    assert cli_main(["fit", "--resume", str(copy)]) == 2
    assert "deploy --resume" in capsys.readouterr().err
    # fresh node workers (the same disks) restore their clients; the rounds after equal an uninterrupted run's
    grid = InProcessGrid(3, nodes)
    deployed_in_process([], grid, resume=str(run_dir))
    assert ("restore", 1000) in grid.sent and "set_states" not in {op for op, _ in grid.sent}
    assert_equal_to_fit(metrics_of(run_dir), fitted)
