"""The composition matrix's deploy x secure-aggregation row: for every shipped rule, ``fdlit deploy``
with ``--privacy.secure_aggregation true`` refuses exactly what ``fit`` refuses, in the same one line
and before any Flower process starts; a rule ``fit`` accepts runs deployed (the FlowerExecutor and the
nodes' workers in this process, as in tests/test_carried_receive.py) with every upload masked on its
node, and equals ``fit`` within the secure sums' fixed-point error. One rule per family that declares
sums (sUWA's predictions, FedAvg's parameters) runs on a real local Flower deployment in
tests/test_secure_deployment.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fdlit.cli import main as cli_main

pytest.importorskip("flwr")

from tests.deploying import (  # noqa: E402
    InProcessGrid,
    assert_equal_to_fit,
    deployed_in_process,
    fit_with_one_thread,
    flower_task,  # noqa: F401  (autouse: what a ServerApp process has)
    metrics_of,
)
from tests.fitting import RULES, only_run, tiny  # noqa: E402

# clients sampled with dropout after the key exchange: the survivors' shares remove the masks
SECURE = ("--data.num_clients", "6", "--federation.participation.fraction", "0.5",
          "--federation.participation.dropout", "0.3", "--federation.executor", "fdlit.execution.SequentialExecutor",
          "--privacy.secure_aggregation", "true")
PROTOCOL = {"secagg_keys", "secagg_shares", "secagg_masked", "secagg_unmask"}  # all that goes up after set-up


class Started(BaseException):
    """``deploy`` reached the start of its local Flower deployment: it accepted the config."""


def deploy_verdict(rule: str, tmp_path: Path, monkeypatch, capsys) -> tuple[int | None, str]:
    """``fdlit deploy``'s exit status and stderr, or None where it went on to start the SuperLink
    (stopped there: no process starts)."""
    import fdlit.deployment.launcher as launcher

    def start(self):
        raise Started

    monkeypatch.setattr(launcher.LocalDeployment, "start", start)
    argv = ["deploy", "--work-dir", str(tmp_path / "work"), *tiny(rule, tmp_path / "deployed", *SECURE)]
    try:
        code = cli_main(argv)
    except Started:
        code = None
    return code, capsys.readouterr().err


@pytest.mark.parametrize("rule", RULES)
def test_deploy_under_secure_aggregation_refuses_what_fit_refuses_and_runs_the_rest_as_fit(rule, tmp_path,
                                                                                           monkeypatch, capsys):
    code, err = deploy_verdict(rule, tmp_path, monkeypatch, capsys)
    fit_args = tiny(rule, tmp_path / "fit", *SECURE)
    if code is not None:  # refused before any process: one line, nothing written, and fit refuses it alike
        assert code == 2 and err.startswith("fdlit: error: ") and len(err.strip().splitlines()) == 1, err
        assert not list(tmp_path.rglob("metrics.jsonl")) and not (tmp_path / "deployed").exists()
        assert cli_main(["fit", *fit_args]) == 2
        assert capsys.readouterr().err == err
        return
    assert err == ""
    fit_with_one_thread(fit_args)  # as the nodes train: one thread
    fitted = metrics_of(only_run(tmp_path / "fit"))
    run_dir = deployed_in_process(tiny(rule, tmp_path / "deployed", *SECURE), InProcessGrid(3))
    deployed = metrics_of(run_dir)
    assert len(deployed) == 2 and sum(f["secagg/clients"] for f in fitted) > 0  # fit masked too
    assert_equal_to_fit(deployed, fitted)  # accuracies, teacher, secagg/*, the ledger's bytes (within 1e-5)
    for d, f in zip(deployed, fitted, strict=True):
        assert d["secagg/fixed_point_error_max"] == f["secagg/fixed_point_error_max"] < 1e-13  # the same sums
        assert d["comm/wire_upload_bytes"] == 0  # no upload array came up from a node
    rows = [json.loads(line) for line in (run_dir / "communication.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in rows if r["direction"] == "up" and r["round"] > 0} == PROTOCOL
