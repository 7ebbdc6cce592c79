"""A node's replies are another party's data: checked before the round uses them (fdlit.deployment.replies,
NodeLink). An invalid reply makes its node a dropout of that round, named; it neither ends the run nor
reaches the aggregation. No Flower process: the Grid is a stand-in that answers with given contents."""

from __future__ import annotations

import math

import pytest
import torch

flwr = pytest.importorskip("flwr", reason="the flower extra is not installed")

from fdlit.deployment.messages import NodeFailure, NodeLink  # noqa: E402
from fdlit.deployment.replies import check_step  # noqa: E402
from fdlit.deployment.wire import pack  # noqa: E402


def step_reply(losses=(0.5, 0.4), logits=None, rows=6, classes=3):
    logits = torch.randn(rows, classes) if logits is None else logits
    meta = {"losses": list(losses), "upload": {"keys": [["logits"], ["logits"]], "typed": [{}, {}]}}
    return meta, {"u0/logits": logits, "u1/logits": torch.randn(rows, classes), "pred/0": torch.ones(2, 4, dtype=torch.bool)}


def test_a_valid_client_step_reply_passes():
    meta, tensors = step_reply()
    assert check_step(meta, tensors, trained=2, uploading=2, expect=(6, 3)) is None


def test_a_masked_upload_sends_only_the_rows_its_mask_keeps():
    """Selective-FD and EdgeFD upload the kept public rows and the mask over all of them."""
    meta, tensors = step_reply()
    meta["upload"]["keys"][0] = ["logits", "mask"]
    mask = torch.tensor([True, False, True, True, False, False])
    tensors.update({"u0/logits": torch.randn(3, 3), "u0/mask": mask})
    assert check_step(meta, tensors, trained=2, uploading=2, expect=(6, 3)) is None
    tensors["u0/logits"] = torch.randn(4, 3)
    assert "for 3 public rows" in check_step(meta, tensors, trained=2, uploading=2, expect=(6, 3))
    tensors.update({"u0/logits": torch.randn(3, 3), "u0/mask": mask[:5]})
    assert "'mask' of shape (5,)" in check_step(meta, tensors, trained=2, uploading=2, expect=(6, 3))
    # hard labels of the kept rows, with 0 x C logits naming C (Selective-FD's hard labels)
    meta["upload"]["keys"][0] = ["logits", "labels", "mask"]
    tensors.update({"u0/logits": torch.randn(0, 3), "u0/labels": torch.tensor([0, 2, 1]), "u0/mask": mask})
    assert check_step(meta, tensors, trained=2, uploading=2, expect=(6, 3)) is None
    tensors["u0/labels"] = torch.tensor([0, 2])
    assert "'labels' of shape (2,) for 3 public rows" in check_step(meta, tensors, trained=2, uploading=2,
                                                                    expect=(6, 3))


@pytest.mark.parametrize("spoil, says", [
    (lambda m, t: m.update(losses=[0.5, math.nan]), "non-finite training loss"),
    (lambda m, t: m.update(losses=[0.5]), "1 losses for 2 clients"),
    (lambda m, t: t.update({"u0/logits": torch.full((6, 3), math.inf)}), "non-finite numbers in 'u0/logits'"),
    (lambda m, t: t.update({"u0/logits": torch.randn(5, 3)}), "'logits' of shape (5, 3) for 6 public rows"),
    (lambda m, t: t.update({"u0/logits": torch.randn(6, 4)}), "expected (6, 3)"),
    (lambda m, t: t.pop("u1/logits"), "arrays ['u1/logits'] named but not sent"),
    (lambda m, t: m.pop("upload"), "no upload for its arriving clients"),
    (lambda m, t: t.update({"u0/topk_values": torch.randn(4, 2)}), "'topk_values' of shape (4, 2) for 6 public rows"),
])
def test_an_invalid_client_step_reply_says_why(spoil, says):
    meta, tensors = step_reply()
    spoil(meta, tensors)
    why = check_step(meta, tensors, trained=2, uploading=2, expect=(6, 3))
    assert why is not None and says in why


class Reply:
    def __init__(self, content, node):
        from types import SimpleNamespace

        self.content = content
        self.metadata = SimpleNamespace(reply_to_message_id=f"m{node}", dst_node_id=node)

    def has_error(self):
        return False


class AnsweringGrid:
    """A Grid whose nodes answer at once with ``answers[node]`` (a RecordDict)."""

    def __init__(self, answers):
        self.answers = answers

    def push_messages(self, messages):
        return [f"m{m.metadata.dst_node_id}" for m in messages]

    def pull_messages(self, ids):
        return [Reply(self.answers[int(i[1:])], int(i[1:])) for i in ids]


def test_a_malformed_or_diverged_reply_is_an_invalid_reply_of_a_tolerated_request_and_a_failure_otherwise(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)  # as in a ServerApp (Flower sets its identity)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    good = pack({"cpu_s": 1.0, "peak_rss": 1, "losses": [0.1]}, {"x": torch.ones(2)})
    broken = pack({"cpu_s": 1.0, "peak_rss": 1}, {"x": torch.ones(2)})
    broken["meta"]["json"] = '{"_layout": [["x", "float32", [100], 0, 400]]}'  # more than it carries
    diverged = pack({"error": "Traceback...\nNumericalFault: client 3 produced NaN/inf in round 2, phase 'private'\n",
                     "error_kind": "NumericalFault", "cpu_s": 1.0, "peak_rss": 1}, {})
    link = NodeLink(AnsweringGrid({1: good, 2: broken, 3: diverged}), 5.0, lambda node: [node])
    replies = link.request("step", {1: ({}, {}), 2: ({}, {}), 3: ({}, {})}, live=[], tolerate=True)
    assert "invalid" not in replies[1][0] and torch.equal(replies[1][1]["x"], torch.ones(2))
    assert replies[2][0]["invalid"].startswith("a malformed reply: tensor 'x'")
    assert replies[3][0]["invalid"] == "NumericalFault: client 3 produced NaN/inf in round 2, phase 'private'"
    with pytest.raises(NodeFailure, match="node 2 sent a malformed reply to 'setup'"):
        link.request("setup", {2: ({}, {})}, live=[], tolerate=False)


def test_an_invalid_reply_makes_its_node_a_dropout_of_that_round_only():
    from fdlit.deployment.executor import FlowerExecutor

    executor = FlowerExecutor(grid=None, nodes=2)
    executor.node_of = {0: 10, 1: 10, 2: 20}
    meta, tensors = step_reply()
    with pytest.warns(UserWarning, match=r"node 20 sent an invalid reply in round 0 \(a non-finite training loss\); "
                                         r"its clients \[2\] are dropouts of this round"):
        kept = executor._valid({10: (meta, tensors), 20: ({"losses": [math.nan]}, {})},
                               lambda node, m, t: None if node == 10 else "a non-finite training loss")
    assert list(kept) == [10] and executor.unreachable() == {2}
    executor._dropped.clear()  # what the next round's client step does first
    assert executor.unreachable() == frozenset()


def test_the_node_workers_key_is_its_owners_alone_from_its_creation(tmp_path, monkeypatch):
    import os
    import stat

    from fdlit.deployment import client_app

    modes = []
    real_open = os.open
    monkeypatch.setattr(client_app.os, "open", lambda path, flags, mode=0o777: modes.append(mode) or real_open(path, flags, mode))
    old = os.umask(0)  # the widest umask: the mode must come from the creating call itself
    try:
        client_app.write_private(tmp_path / "worker.key", b"secret")
    finally:
        os.umask(old)
    assert modes == [0o600] and stat.S_IMODE((tmp_path / "worker.key").stat().st_mode) == 0o600
    assert (tmp_path / "worker.key").read_bytes() == b"secret"
