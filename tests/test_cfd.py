"""CFD (Sattler et al. 2020): the codes are real DEFLATE streams of deltas that decode exactly, each
client rebuilds the teacher the server computed, the ledger charges the compressed sizes, and runs
resume and vectorize exactly."""

import math
import zlib

import pytest
import torch

from fdlit.cli import main
from fdlit.messages import Message
from fdlit.methods import CFD
from fdlit.methods.base import ClientContext, FederationInfo, ServerContext
from fdlit.methods.cfd import decode, dequantise, encode
from fdlit.runs import read_jsonl
from tests.fitting import EXECUTORS, fit_loop, ledger_rows, only_run, tiny, without_time

PARTIAL = ("--federation.participation.fraction", "0.5", "--federation.participation.dropout", "0.3",
           "--federation.participation.public_fraction", "0.25")


def test_a_code_is_the_deflate_stream_of_the_deltas_and_decodes_exactly():
    g = torch.Generator().manual_seed(0)
    previous = torch.randint(0, 10, (200,), generator=g, dtype=torch.uint8)
    values = previous.clone()
    values[::7] = (values[::7] + 3) % 10  # a few rows change
    code = encode(values, previous, 10)
    assert bytes(code.numpy()) == zlib.compress(((values.long() - previous.long()) % 10).to(torch.uint8).numpy().tobytes(), 9)
    assert torch.equal(decode(code, previous, 10), values)
    assert len(code) < len(values)  # mostly zeros: DEFLATE shrinks them


def test_each_client_rebuilds_the_teacher_and_the_server_the_labels_under_participation():
    method = CFD(download_bits=4)
    part = method.client_part()
    clients, size, rows, classes = 4, 20, 8, 5
    states = [{} for _ in range(clients)]
    g = torch.Generator().manual_seed(1)
    for r in range(1, 7):
        ids = torch.randperm(size, generator=g)[:rows]
        arrived = [i for i in range(clients) if (i + r) % 3]  # a changing half of the clients
        logits = torch.randn(clients, rows, classes, generator=g)
        info = FederationInfo(r, 0, clients, classes, torch.zeros(rows, 1), clients=tuple(arrived),
                              public_index=ids, public_size=size)
        uploads = [part.upload(ClientContext(info, None, None, logits[i], {}, states[i])) for i in arrived]
        result = method.aggregate(uploads, ServerContext(info))
        votes = torch.stack([torch.nn.functional.one_hot(logits[i].argmax(-1), classes) for i in arrived]).double().mean(0)
        expected = (votes * 15).round()
        torch.testing.assert_close(result.teacher, dequantise(expected))
        sent = method.configure(Message({"teacher": result.teacher}), arrived, ServerContext(info))
        for i in arrived:
            part.receive(ClientContext(info, None, None, None, dict(sent[i]), states[i]))
            torch.testing.assert_close(dequantise(states[i]["held_teacher"][ids]), result.teacher)


def test_the_ledger_charges_the_compressed_sizes(tmp_path):
    loop = fit_loop(tiny("digits_cfd.yaml", tmp_path, "--federation.participation.public_fraction", "0.5", rounds=3))
    up = [m for m in loop.server_side.ledger.messages if m.direction == "up" and m.round >= 1]
    assert {m.kind for m in up} == {"code"}
    for m in loop.history:  # the method's own count of the codes it decoded equals the ledger's
        this = [x.bytes for x in up if x.round == m["round"]]
        assert math.isclose(sum(this) / len(this), m["cfd/up_bytes_per_client"])
    # smaller than sending the 60 class ids raw, and than N x C float32 probabilities by far
    assert all(x.bytes < 60 for x in up) and loop.history[-1]["comm/down_bytes_total"] < 3 * 4 * 60 * 10 * 4 / 8


def test_stopped_and_resumed_equals_an_uninterrupted_run(tmp_path):
    assert main(["fit", *tiny("digits_cfd.yaml", tmp_path / "straight", *PARTIAL, rounds=3)]) == 0
    assert main(["fit", *tiny("digits_cfd.yaml", tmp_path / "stopped", *PARTIAL, rounds=1)]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "3"]) == 0
    straight = only_run(tmp_path / "straight")
    assert read_jsonl(stopped / "communication.jsonl") == read_jsonl(straight / "communication.jsonl")
    assert without_time(read_jsonl(stopped / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))


def test_vectorized_equals_sequential(tmp_path):
    seq = fit_loop(tiny("digits_cfd.yaml", tmp_path / "seq", *PARTIAL, "--federation.executor", EXECUTORS["sequential"]))
    vec = fit_loop(tiny("digits_cfd.yaml", tmp_path / "vec", *PARTIAL, "--federation.executor", EXECUTORS["vectorized"]))
    assert ledger_rows(vec) == ledger_rows(seq)


@pytest.mark.parametrize("value", ["0", "9"])
def test_bad_bits_are_refused_in_one_line(value, tmp_path, capsys):
    assert main(["fit", *tiny("digits_cfd.yaml", tmp_path, "--aggregator.init_args.download_bits", value)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: aggregator.download_bits")
