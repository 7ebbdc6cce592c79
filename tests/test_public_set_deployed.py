"""SCARLET, CFD and COMET deployed: run through the FlowerExecutor (every node's worker in this process),
each equals ``fit`` — accuracies, teachers and the ledger's bytes (SCARLET's cache changes, CFD's coded
sizes) — and under client sampling a SCARLET client that missed rounds catches up on the cache changes
it missed on its node, as in ``fit``."""

import json

import pytest

from tests.deploying import (
    InProcessGrid,
    assert_equal_to_fit,
    deployed_in_process,
    fit_with_one_thread,
    flower_task,  # noqa: F401  (a ServerApp's task identity, for every test here)
    metrics_of,
)
from tests.fitting import only_run, tiny

SUBSET = ("--federation.participation.public_fraction", "0.5")
SAMPLED = ("--federation.participation.fraction", "0.5", "--federation.participation.dropout", "0.3", *SUBSET)


def ledger(run_dir):
    return [(r["round"], r["client"], r["direction"], r["kind"], r["bytes"])
            for r in map(json.loads, (run_dir / "communication.jsonl").read_text().splitlines())]


@pytest.mark.parametrize(("config", "extra"), [
    ("digits_scarlet.yaml", (*SAMPLED, "--aggregator.init_args.cache_duration", "2")),
    ("digits_cfd.yaml", SUBSET),
    ("digits_comet.yaml", ()),
])
def test_deployed_equals_fit(config, extra, tmp_path):
    fit_with_one_thread(tiny(config, tmp_path / "fit", *extra, rounds=3))  # the nodes train with one thread
    fitted = metrics_of(only_run(tmp_path / "fit"))
    run_dir = deployed_in_process(tiny(config, tmp_path / "deployed", *extra, rounds=3), InProcessGrid(2))
    deployed = metrics_of(run_dir)
    assert len(deployed) == 3
    assert_equal_to_fit(deployed, fitted)
    assert ledger(run_dir) == ledger(only_run(tmp_path / "fit"))  # message by message, bytes as counted
    if config == "digits_scarlet.yaml":
        ups = [sum(b for r, _, d, _, b in ledger(run_dir) if r == k and d == "up") for k in (1, 2, 3)]
        assert ups[1] < ups[0]  # cached rows were not sent again
