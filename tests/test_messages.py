"""Messages: arrays, metrics and config kept apart by type; every array counted; Flower's records both ways."""

import pytest
import torch

from fdlit.federation.server_side import ServerSide
from fdlit.messages import Message, as_message, metric_values
from fdlit.methods import ProbabilityAveraging
from fdlit.privacy import UploadPrivacy


def test_a_message_reads_like_its_arrays_and_keeps_metrics_apart():
    m = Message({"logits": torch.ones(3, 2)}, metrics={"density/dropped_components": 2.0}, config={"round": 1})
    assert set(m) == {"logits"} and m["logits"].shape == (3, 2) and "density/dropped_components" not in m
    kept = m.with_arrays({"logits": torch.zeros(3, 2), "mask": torch.ones(3, dtype=torch.bool)})
    assert kept.metrics == m.metrics and kept.config == m.config and set(kept) == {"logits", "mask"}
    assert as_message({"x": torch.ones(1)}).arrays.keys() == {"x"} and as_message(m) is m
    assert metric_values([m, Message()], "density/dropped_components") == [2.0]


def test_every_array_is_counted_whatever_its_name_and_metrics_are_not_protocol_bytes():
    server = ServerSide(ProbabilityAveraging(), UploadPrivacy(), None, torch.float32)
    sent = server.send_up(1, 0, Message({"logits": torch.ones(4, 3), "_initial": torch.ones(5, dtype=torch.float64),
                                         "mask": torch.ones(9, dtype=torch.bool)}, metrics={"m": 1.0}))
    assert sent.metrics == {"m": 1.0}
    rows = {(m.kind, m.bytes) for m in server.ledger.messages}
    assert rows == {("logits", 48), ("_initial", 40), ("mask", 2)}  # a name is just a name; masks as bits
    assert server.ledger.total("up") == 90


def test_flower_records_round_trip_without_loss():
    pytest.importorskip("flwr")
    from flwr.app import RecordDict

    m = Message({"logits": torch.randn(4, 3), "teacher": torch.randn(2, 3).to(torch.bfloat16),
                 "classes": torch.tensor([1, 4], dtype=torch.int16), "keep": torch.tensor([True, False])},
                metrics={"density/dropped_components": 1.0, "privacy/noise_std": 0.25},
                config={"round": 3, "hook": "upload", "last": True}, sensitivity={"logits": "rows", "classes": "clear"})
    records = m.to_records()
    assert isinstance(records, RecordDict) and set(records) == {"arrays", "metrics", "config"}
    back = Message.from_records(records)
    assert back.metrics == m.metrics and back.config == m.config and back.sensitivity == m.sensitivity
    assert set(back) == set(m)
    for key in m:
        assert back[key].dtype == m[key].dtype and torch.equal(back[key], m[key]), key
