"""Running a config deployed, for the deployment tests: on a real local Flower deployment (``deploy_run``)
or in one process through a Grid that hands each message to its node at once (``deployed_in_process``),
and comparing the result with ``fit`` (not a test module: tests import these instead of importing each
other)."""

from __future__ import annotations

import json
import math
import time
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fdlit.cli import main as cli_main

# a deployed run costs mostly its processes' start (imports, set-up) and the training that its comparison
# with fit repeats; few epochs keep the latter small and change nothing that is compared
FEW_EPOCHS = ["--federation.private_epochs_first", "2", "--federation.private_epochs", "1",
              "--federation.public_epochs_first", "1", "--federation.public_epochs", "1"]


def close(a, b) -> bool:
    """Equal within 1e-5, NaN equal to NaN, through nested lists (per-client values, trust matrices)."""
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(b, float) and isinstance(a, (int, float)):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-5
    return a == b


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def deploy_run(deployment, args: list[str], timeout: float = 300.0, resume: str | None = None) -> dict:
    from fdlit.deployment.command import fit_arguments, run_on

    options = Namespace(nodes=3, timeout=timeout, node_wait=120.0, run_timeout=900.0, threads=1,
                        root_certificates=None)
    fit_args = ["--resume", resume, *args] if resume else fit_arguments(args)[0]
    return run_on(deployment.dep.address, deployment.work, deployment.env, options, fit_args)


def fit_with_one_thread(args: list[str]) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the nodes (threads=1): other thread counts round sums differently
    try:
        assert cli_main(["fit", *args]) == 0
    finally:
        torch.set_num_threads(threads)


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
        from fdlit.deployment.wire import unpack

        for m in messages:
            node = m.metadata.dst_node_id
            self.sent.append((unpack(m.content)[0]["op"], node))
            ids.append(mid := f"m{len(self.sent)}")
            self.replies[mid] = self.workers[node].handle(m.content)
        return ids

    def pull_messages(self, ids):
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i), has_error=lambda: False,
                                content=self.replies.pop(i)) for i in ids if i in self.replies]


class ThreadedGrid(InProcessGrid):
    """``InProcessGrid`` whose nodes work on their own: each node's worker handles its messages in order
    in a thread of its own, and a reply can be pulled once it is made (real time, as on Flower)."""

    def __init__(self, nodes: int, node_config: dict | None = None):
        import queue
        import threading

        super().__init__(nodes, node_config)
        self.lock, self.replied = threading.Lock(), []  # (message id, node) in the order replies were made
        self.working = threading.Lock()  # one worker computes at a time (torch's global random state), each holds alone
        self.queues = {node: queue.Queue() for node in self.workers}
        for node in self.workers:
            threading.Thread(target=self._work, args=(node,), daemon=True).start()

    def _work(self, node):
        torch.set_num_threads(1)
        while True:
            mid, content = self.queues[node].get()
            if content is None:
                return
            with self.working:
                reply, due = self.workers[node].answer(content)
            time.sleep(max(0.0, due - time.monotonic()))
            with self.lock:
                self.replies[mid] = reply
                self.replied.append((mid, node, time.monotonic()))

    def _push(self, messages):
        from fdlit.deployment.wire import unpack

        ids = []
        for m in messages:
            node = m.metadata.dst_node_id
            with self.lock:
                self.sent.append((unpack(m.content)[0]["op"], node))
                ids.append(mid := f"m{len(self.sent)}")
            self.queues[node].put((mid, m.content))
        return ids

    def pull_messages(self, ids):
        with self.lock:
            return super().pull_messages(ids)

    def close(self):
        for q in self.queues.values():
            q.put((None, None))


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
