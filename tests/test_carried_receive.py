"""A deployment's requests in one process: the FlowerExecutor talks to NodeWorkers through a Grid
that hands each message to its node at once (no Flower processes), so what the server sends a round
and what a node keeps on disk are checked in seconds; the real deployment is tests/test_deployment.py."""

from __future__ import annotations

import shutil

import pytest

from fdlit.cli import main as cli_main

pytest.importorskip("flwr")

from tests.deploying import (  # noqa: E402
    InProcessGrid,
    assert_equal_to_fit,
    deployed_in_process,
    flower_task,  # noqa: F401  (autouse: what a ServerApp process has)
    metrics_of,
)

ROUNDS = ["--federation.executor", "fdlit.execution.SequentialExecutor", "--logger.mode", "disabled",
          "--logger.progress", "false", "--data.num_clients", "6"]


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
