"""Secure aggregation over a deployment's messages (fdlit.deployment.secure_rounds and secure_node):
the server half and three nodes' halves talk through Flower records (pack/unpack) in one process,
one node stops answering after sharing, and the sum is still fit's; the server receives no upload.
The deploy test runs it on a real local Flower deployment against ``fit``."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch

from fdlit.cli import main as cli_main
from fdlit.messages import Message
from fdlit.methods import ProbabilityAveraging
from fdlit.privacy import UploadPrivacy
from fdlit.privacy.secure_upload import SecureSums, masked_sums

pytest.importorskip("flwr", reason="the flower extra is not installed")

from fdlit.deployment.secure_node import NodeSecureAggregation  # noqa: E402
from fdlit.deployment.secure_rounds import SecureRounds  # noqa: E402
from fdlit.deployment.wire import pack, unpack  # noqa: E402

HOSTED = {10: [0, 1], 20: [2, 3], 30: [4, 5]}  # node -> its clients


class Nodes:
    """Three nodes' halves behind a ``request`` that carries every request and reply as Flower records;
    ``silent``: (op, node) pairs that get no reply (the node is lost there)."""

    def __init__(self, silent=()):
        self.halves = {node: NodeSecureAggregation() for node in HOSTED}
        self.silent, self.received = set(silent), []  # what reached the server: (op, meta, tensors)

    def request(self, op, per_node, tolerate=False):
        replies = {}
        for node, (meta, tensors) in per_node.items():
            if (op, node) in self.silent:
                continue
            meta, tensors = unpack(pack(meta, tensors))
            reply = unpack(pack(*getattr(self.halves[node], op.removeprefix("secagg_"))(meta, tensors)))
            self.received.append((op, *reply))
            replies[node] = reply
        return replies


def uploads(m: int = 6, n: int = 30, c: int = 10) -> list[Message]:
    g = torch.Generator().manual_seed(3)
    return [Message({"logits": torch.randn(n, c, generator=g) * 2}) for _ in range(m)]


def run_round(nodes: Nodes, arriving: list[int], r: int = 4):
    """Round r: the client step (keys up, each arriving client's terms kept on its node), then the sum."""
    privacy = UploadPrivacy(secure_aggregation=True)
    privacy.check(ProbabilityAveraging(), 10)  # the nodes' own config: AVG's terms, the probabilities
    messages = uploads()
    server = SecureRounds(nodes.request, lambda: {c: n for n, cs in HOSTED.items() for c in cs})
    step = {}
    for node, clients in HOSTED.items():
        meta = server.step_meta(r, clients)  # what the client step's request carries
        ids, keys = nodes.halves[node].start(meta["round"], meta["clients"])
        here = [i for i in clients if i in arriving]
        stripped = nodes.halves[node].keep(here, [messages[i] for i in here], privacy)
        assert all(not m.arrays for m in stripped)  # the upload's arrays stay on the node
        step[node] = unpack(pack({"secagg_ids": ids}, {"secagg/keys": keys}))
    server.keep_keys(step)
    sent = []
    sums, stats = server.secure_sum(r, list(range(6)), arriving, 0.5, lambda *m: sent.append(m))
    return sums, stats, messages, privacy, sent


def test_a_node_lost_after_sharing_is_recovered_and_the_sum_is_fits():
    nodes = Nodes(silent={("secagg_mask", 30)})  # clients 4 and 5 shared their keys, then their node went silent
    arriving = [0, 1, 2, 3, 4]  # client 5 dropped after the client step (participation), 4 with its node
    sums, stats, messages, privacy, sent = run_round(nodes, arriving)
    survivors = [0, 1, 2, 3]
    assert isinstance(sums, SecureSums) and sums.clients == tuple(survivors)
    assert stats["secagg/dropped_after_sharing"] == 2 and stats["secagg/failed"] == 0 and stats["secagg/clients"] == 6
    # fit's in-process protocol with the same key exchange (6 clients) gives the same sums, bit for bit
    fit, _ = masked_sums(4, list(range(6)), survivors, [privacy.secure_terms(messages[i], i) for i in survivors],
                         lambda *m: None)
    assert torch.equal(sums.sums["probabilities"], fit.sums["probabilities"])
    plain = sum(messages[i]["logits"].softmax(-1).double() for i in survivors)
    assert (sums.sums["probabilities"] - plain).abs().max() <= sums.error["probabilities"] + 1e-15
    # what the server received: keys, ciphertexts, masked vectors, shares; no float array, no encoding
    assert {op for op, *_ in nodes.received} == {"secagg_share", "secagg_mask", "secagg_unmask"}
    for op, meta, tensors in nodes.received:
        assert not any(t.is_floating_point() for t in tensors.values()), op
    masked = [t for op, _, tensors in nodes.received for k, t in tensors.items() if k == "masked"]
    assert sum(len(t) for t in masked) == 4
    bits = 62 - int(np.ceil(np.log2(6)))
    for y in torch.cat(masked):  # uniform over Z_2^64, nowhere near a client's probabilities
        assert np.abs(np.ldexp(y.numpy().astype(np.float64), -bits)).mean() > 1
    # the ledger counts the protocol's messages as fit does: masked vectors from the 4 survivors only
    kinds = [(c, d, k) for _, c, d, k, _ in sent]
    assert sorted(c for c, d, k in kinds if k == "secagg_masked") == survivors
    assert sorted(c for c, d, k in kinds if k == "secagg_unmask") == survivors


def test_fewer_survivors_than_the_threshold_give_no_sum_and_no_share_is_asked_for():
    nodes = Nodes(silent={("secagg_mask", 20), ("secagg_mask", 30)})
    sums, stats, *_ = run_round(nodes, [0, 1, 2, 3, 4, 5])  # 2 masked vectors arrive, t = 3
    assert sums is None and stats["secagg/failed"] == 1 and stats["secagg/threshold"] == 3
    assert "secagg_unmask" not in {op for op, *_ in nodes.received}


def test_a_node_never_reveals_the_mask_key_of_a_client_that_sent_its_masked_terms():
    nodes = Nodes()
    half = nodes.halves[10]
    nodes.request = lambda op, per_node, tolerate=False: (
        Nodes.request(nodes, op, {n: ({**m, "dropped": [0], "survivors": [1, 2, 3, 4, 5]}, t) for n, (m, t) in
                                  per_node.items()}) if op == "secagg_unmask" else Nodes.request(nodes, op, per_node))
    with pytest.raises(RuntimeError, match=r"clients \[0\] sent their masked terms and are named dropped"):
        run_round(nodes, [0, 1, 2, 3, 4, 5])
    assert half.people  # nothing was revealed


def test_deploy_refuses_a_rule_that_cannot_be_masked_and_colluding_attackers_in_one_line(tmp_path, capsys,
                                                                                        monkeypatch):
    import fdlit.deployment.launcher as launcher

    monkeypatch.setattr(launcher.LocalDeployment, "start", lambda self: pytest.fail("a process was started"))
    small = ["deploy", "--work-dir", str(tmp_path / "work"), "--config", "digits_avg.yaml", "--data.num_clients", "6",
             "--federation.rounds", "1", "--privacy.secure_aggregation", "true", "--logger.run_dir", str(tmp_path / "runs")]
    cases = [(["--aggregator", "fdlit.methods.CoordinateMedian"], "privacy.secure_aggregation: secure aggregation gives "
              "the server only the sum", "CoordinateMedian takes a median"),
             (["--adversaries.attack", "fdlit.adversaries.LabelFlipping", "--adversaries.count", "2",
               "--adversaries.collude", "true"], "adversaries.collude: ", "holds no upload to copy")]
    for flags, field, words in cases:
        assert cli_main([*small, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fdlit: error: {field}") and words in err[0], err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*"))


# ---------------------------------------------------------------------- a real deployment
@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from fdlit.deployment.launcher import LocalDeployment, flower_env

    work = tmp_path_factory.mktemp("deploy")
    dep = LocalDeployment(3, work)
    dep.start()
    yield Namespace(dep=dep, work=work, env=flower_env(work))
    dep.stop()
    assert all(p.returncode is not None for p in dep.processes)


@pytest.mark.deploy
# sUWA (predictions) and FedAvg (parameters; its terms read the n_k the server holds), 30 % of the
# sampled clients dropping after the key exchange, on 3 SuperNodes
@pytest.mark.parametrize("config", ["digits.yaml", "digits_fedavg.yaml"])
def test_a_deployed_secure_run_equals_fits_and_no_upload_reaches_the_server(deployment, config, tmp_path):
    """Every accuracy, teacher and ledger byte equals fit's; the only arrays that came up are the protocol's."""
    from tests.deploying import FEW_EPOCHS, close, deploy_run, fit_with_one_thread, metrics_of

    args = ["--config", config, "--federation.rounds", "2", "--federation.executor",
            "fdlit.execution.SequentialExecutor", "--federation.participation.dropout", "0.3",
            "--privacy.secure_aggregation", "true", *FEW_EPOCHS]
    outcome = deploy_run(deployment, [*args, "--logger.run_dir", str(tmp_path / "deployed")])
    assert outcome["status"] == "done", outcome
    fit_with_one_thread([*args, "--logger.run_dir", str(tmp_path / "fit")])
    deployed, fitted = metrics_of(Path(outcome["run_dir"])), metrics_of(next((tmp_path / "fit").iterdir()))
    assert len(deployed) == len(fitted) == 2
    assert sum(f["secagg/dropped_after_sharing"] for f in fitted) > 0  # the survivors' shares did remove masks
    for d, f in zip(deployed, fitted, strict=True):
        for key, value in f.items():  # accuracies, teacher, secagg/*, the ledger's bytes: all but times
            if not key.startswith("time/"):
                assert close(d[key], value), key
        # the sums are fit's bit for bit; their fixed-point error (docs/privacy.md) is far below the 1e-5 allowed
        assert d["secagg/fixed_point_error_max"] == f["secagg/fixed_point_error_max"] < 1e-13
        assert d["comm/wire_upload_bytes"] == 0  # no upload array came up from a node
        assert d["comm/wire/secagg_mask_up"] > 0 and d["comm/wire/secagg_unmask_up"] > 0
        assert d["comm/exchanges"] >= 5  # the client step, 3 protocol exchanges, the teacher or the broadcast
    rows = [json.loads(line) for line in (Path(outcome["run_dir"]) / "communication.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in rows if r["direction"] == "up" and r["round"] > 0} == {
        "secagg_keys", "secagg_shares", "secagg_masked", "secagg_unmask"}
