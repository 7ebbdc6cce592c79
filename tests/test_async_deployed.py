"""Asynchronous federated distillation deployed, on real time: each client's job is its own Message, a
release takes the uploads that have arrived, and with the clock's ``real_time_scale`` the nodes hold
their replies for their devices' virtual times. Nodes that work on their own (one thread each) then
take, release by release, the uploads a virtual-clock ``fit`` takes, and learn exactly what it learns."""

import json

import pytest

from fdlit.deployment.wire import unpack
from tests.clocked import CLOCK, clock
from tests.clocked import tiny as clocked_tiny
from tests.deploying import (
    ThreadedGrid,
    assert_equal_to_fit,
    deployed_in_process,
    fit_with_one_thread,
    flower_task,  # noqa: F401  (a ServerApp's task identity, for every test here)
    metrics_of,
)
from tests.fitting import only_run

# four devices whose uploads arrive well apart: a release takes clients 0, 1, 0, 3 and 0 after the first
COMPUTATION_MS = [1.2, 2.0, 7.0, 3.0]


def uploads_by_release(run_dir):
    rows = [json.loads(line) for line in (run_dir / "communication.jsonl").read_text().splitlines()]
    out = {}
    for r in rows:
        if r["direction"] == "up":
            out.setdefault(r["round"], set()).add(r["client"])
    return {k: sorted(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """The run's arguments (four devices on a trace, buffer 1, 0.7 real seconds per virtual second)
    and its virtual-clock ``fit``."""
    folder = tmp_path_factory.mktemp("scaled")
    trace = folder / "devices.json"
    trace.write_text(json.dumps({str(k): {"computation": c, "communication": 100000.0}
                                 for k, c in enumerate(COMPUTATION_MS)}))
    profile = {"class_path": CLOCK + "TraceProfile", "init_args": {"path": str(trace)}}
    args = clocked_tiny("--config", "methods/avg.yaml", "--federation.executor", "fdlit.execution.SequentialExecutor",
                        *clock("AsynchronousClock", buffer=1, profile=profile, real_time_scale=0.7), rounds=6)
    fit_with_one_thread([*args, "--logger.run_dir", str(folder / "fit")])
    return args, only_run(folder / "fit")


def test_releases_take_the_uploads_that_arrived_first_as_the_virtual_clock_does(scaled, tmp_path):
    args, fitted = scaled
    expected = uploads_by_release(fitted)
    assert [expected[r] for r in range(2, 7)] == [[0], [1], [0], [3], [0]]  # the devices as chosen
    grid = ThreadedGrid(4)
    try:
        deployed = deployed_in_process([*args, "--logger.run_dir", str(tmp_path / "deployed")], grid)
    finally:
        grid.close()
    assert uploads_by_release(deployed) == expected
    assert_equal_to_fit(metrics_of(deployed), metrics_of(fitted))  # staleness, teachers, accuracies
    jobs = [op for op, _ in grid.sent].count("step")
    assert jobs == 4 + 4 + 4  # release 1's step to every node, then a job after each distillation but the last


def test_without_a_scale_the_nodes_own_speed_decides(tmp_path):
    """Equal devices on the profile, but node 3 really is slower (3 s a job): it is never among the first arrivals
    (sUWA, whose uploads carry more than logits: the cached uploads checkpoint with the run)."""
    args = clocked_tiny("--federation.executor", "fdlit.execution.SequentialExecutor",
                        *clock("AsynchronousClock", buffer=2), rounds=4)
    grid = ThreadedGrid(4)
    slow = grid.workers[1003]
    answer = slow.answer

    def slower(content):  # a slow device: each job's upload leaves 3 s late
        reply, due = answer(content)
        return reply, due + 3.0 * ("hold_s" in unpack(content)[0])

    slow.answer = slower
    try:
        deployed = deployed_in_process([*args, "--logger.run_dir", str(tmp_path)], grid)
    finally:
        grid.close()
    taken = uploads_by_release(deployed)
    assert all(3 not in taken[r] and len(taken[r]) == 2 for r in (2, 3, 4)), taken
    assert [m["async/arrivals"] for m in metrics_of(deployed)] == [4, 2, 2, 2]


def test_a_killed_deployment_resumes_its_releases_as_an_uninterrupted_one(scaled, tmp_path):
    """The ServerApp killed in release 2: the nodes restore each client as its last distillation left it,
    each starts again the job it had in flight, and the releases after take what the virtual clock takes."""
    args, fitted = scaled
    nodes = {"checkpoint-dir": str(tmp_path / "node-disk")}
    grid = ThreadedGrid(4, nodes)
    grid.die_at_step = 3  # the ServerApp killed as it sends the first job after release 2 (the 9th step message)
    with pytest.raises(KeyboardInterrupt):
        deployed_in_process([*args, "--logger.run_dir", str(tmp_path / "killed")], grid)
    grid.close()
    (run_dir,) = (tmp_path / "killed").iterdir()
    assert len(metrics_of(run_dir)) == 1
    grid = ThreadedGrid(4, nodes)
    try:
        deployed_in_process([], grid, resume=str(run_dir))
    finally:
        grid.close()
    assert {("restore", n) for n in grid.workers} <= set(grid.sent)
    assert uploads_by_release(run_dir) == uploads_by_release(fitted)
    assert_equal_to_fit(metrics_of(run_dir), metrics_of(fitted))
