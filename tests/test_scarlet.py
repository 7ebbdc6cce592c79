"""SCARLET (Azuma et al. 2025): the soft-label cache saves upload bytes, D = 0 is Enhanced ERA without a
cache, the cache follows an independent reading of the authors' rules, each client's mirror matches the
server's cache under participation, and runs resume and vectorize exactly."""

import math

import pytest
import torch

from fdlit.cli import main
from fdlit.messages import Message
from fdlit.methods import SCARLET
from fdlit.methods.base import ClientContext, FederationInfo, ServerContext
from fdlit.methods.scarlet import cache_valid, enhanced_era
from fdlit.runs import read_jsonl
from tests.fitting import EXECUTORS, fit_loop, ledger_rows, only_run, tiny, without_time

SUBSET = ("--federation.participation.public_fraction", "0.25")  # 30 of the 120 public rows
PARTIAL = ("--federation.participation.fraction", "0.5", "--federation.participation.dropout", "0.3")


def scarlet_args(tmp_path, *extra, rounds=4, duration=50):
    return tiny("digits_scarlet.yaml", tmp_path, *SUBSET, "--aggregator.init_args.cache_duration", str(duration),
                *extra, rounds=rounds)


# ---------------------------------------------------------------- an independent reading of the rules
class ReferenceCache:
    """The authors' cache as their server handler states it (one entry per public sample: a label and
    the round it was stored; a requested row is stored if empty, else cleared), written over Python
    lists; cache_ratio 1."""

    def __init__(self, size, duration, exponent):
        self.entries = [None] * size
        self.duration, self.exponent = duration, exponent

    def requested(self, ids, r):
        # drawn at the end of round r - 1, as the authors' set_next_public_indices does
        return [i for i in ids if not (self.entries[i] is not None and self.entries[i][1] + self.duration > r - 1)]

    def round(self, ids, r, probs_by_client):  # probs_by_client: one {row id: probabilities} per client
        asked = set(self.requested(ids, r))
        teacher = {}
        for i in ids:
            if i in asked:
                mean = sum(p[i].double() for p in probs_by_client) / len(probs_by_client)
                teacher[i] = (mean ** self.exponent / (mean ** self.exponent).sum()).float()
                self.entries[i] = (teacher[i], r) if self.entries[i] is None else None  # store, or expire
            else:
                teacher[i] = self.entries[i][0]
        return teacher


def client_ctx(info, state, logits):
    return ClientContext(info, None, None, logits, {}, state)


def drive(method, rounds, participants, size=12, rows=6, classes=3, clients=3, seed=0):
    """Rounds of the method's two parts outside a run: each participant's client part uploads, the
    server aggregates and configures, each participant receives. Yields per round what was sent."""
    part = method.client_part()
    states = [{} for _ in range(clients)]
    g = torch.Generator().manual_seed(seed)
    for r in range(1, rounds + 1):
        ids = torch.randperm(size, generator=g)[:rows]
        logits = torch.randn(clients, size, classes, generator=g) * 3
        arrived = participants(r)
        info = FederationInfo(r, seed, clients, classes, torch.zeros(rows, 1), clients=tuple(arrived),
                              public_index=ids, public_size=size)
        uploads = [part.upload(client_ctx(info, states[i], logits[i, ids])) for i in arrived]
        result = method.aggregate(uploads, ServerContext(info))
        sent = method.configure(Message({"teacher": result.teacher}), list(arrived), ServerContext(info))
        for i in arrived:
            part.receive(ClientContext(info, None, None, None, dict(sent[i]), states[i]))
        yield r, ids, logits, arrived, uploads, result, sent, states


def test_at_cache_duration_0_every_row_is_sent_every_round_and_the_teacher_is_enhanced_era():
    method = SCARLET(era_exponent=2.0, cache_duration=0)
    for _r, ids, logits, arrived, uploads, result, _sent, _ in drive(method, 5, lambda r: [0, 1, 2]):
        assert all(bool(u["requested"].all()) and len(u["logits"]) == len(ids) for u in uploads)
        mean = logits[arrived][:, ids].softmax(-1).mean(0)
        sharpened = mean ** 2 / (mean ** 2).sum(-1, keepdim=True)
        torch.testing.assert_close(result.teacher, sharpened, rtol=1e-5, atol=1e-6)
        assert result.stats["scarlet/cached_rows"] == 0


@pytest.mark.parametrize("duration", [1, 2, 4])
def test_the_cache_follows_the_authors_rules(duration):
    method = SCARLET(era_exponent=1.5, cache_duration=duration)
    reference = ReferenceCache(12, duration, 1.5)
    served = 0
    for r, ids, logits, arrived, uploads, result, _sent, _ in drive(method, 8, lambda r: [0, 1, 2]):
        asked = reference.requested(ids.tolist(), r)
        assert [ids[u["requested"]].tolist() for u in uploads] == [asked] * 3  # the clients' mirrors agree
        probs = [{i: logits[c, i].softmax(-1) for i in ids.tolist()} for c in arrived]
        expected = reference.round(ids.tolist(), r, probs)
        torch.testing.assert_close(result.teacher, torch.stack([expected[i] for i in ids.tolist()]), rtol=1e-5, atol=1e-6)
        served += len(ids) - len(asked)
    assert served > 0  # the cache served rows


def test_a_client_that_missed_rounds_gets_the_changes_it_missed_and_its_mirror_matches_the_cache():
    method = SCARLET(era_exponent=2.0, cache_duration=3)
    absent = {2: [0, 1], 3: [0, 1], 4: [1, 2], 5: [0, 2]}
    catch_up = 0
    for r, ids, _logits, arrived, uploads, result, sent, states in drive(method, 9, lambda r: absent.get(r, [0, 1, 2])):
        for j, i in enumerate(arrived):
            message = sent[i]
            # what goes down is never more than the round's rows, and only the rows it lacked
            assert len(message["teacher"]) == int(message["teacher_rows"].sum()) <= len(ids)
            catch_up += int((message["cache_signal"] == 2).sum())
            labels, stored = states[i]["cache_labels"], states[i]["cache_stored"]
            # the client's mirror now holds this round's teacher on every row of the round
            torch.testing.assert_close(labels[ids], result.teacher)
            torch.testing.assert_close(stored[ids], method.cache_stored[ids])  # and the server's entries
            # any row its mirror counts as cached is the server's entry (so its uploads skip only those)
            valid = cache_valid(stored, r, 3)
            assert bool((method.cache_stored[valid] == stored[valid]).all())
            torch.testing.assert_close(labels[valid], method.cache_labels[valid])
    assert catch_up > 0  # some client was sent a cached label it had missed


def test_enhanced_era_at_exponent_1_is_the_mean_and_sharpens_above_1():
    p = torch.softmax(torch.randn(20, 5), -1)
    torch.testing.assert_close(enhanced_era(p, 1.0), p)
    entropy = lambda q: -(q * q.log()).sum(-1)  # noqa: E731
    assert bool((entropy(enhanced_era(p, 2.0)) < entropy(p)).all())


# ---------------------------------------------------------------- through the real entry point
def up_logit_bytes(loop):
    return sum(m.bytes for m in loop.server_side.ledger.messages if m.direction == "up" and m.kind == "logits")


def test_bytes_up_fall_with_cache_duration(tmp_path):
    loops = {d: fit_loop(scarlet_args(tmp_path / str(d), duration=d, rounds=5)) for d in (0, 2, 5)}
    sent = {d: up_logit_bytes(loop) for d, loop in loops.items()}
    assert sent[0] > sent[2] > sent[5]
    # D = 0: every one of the 30 rows, from each of the 4 clients, in float32, every round
    assert sent[0] == 5 * 4 * 30 * 10 * 4
    assert all(m["scarlet/requested_rows"] == 30 for m in loops[0].history)
    # the ledger charges what the clients sent: cached rows never go up
    for m in loops[5].history:
        assert m["comm/up/logits"] == 4 * m["scarlet/requested_rows"] * 10 * 4
    assert loops[5].history[-1]["comm/down_bytes_total"] < loops[0].history[-1]["comm/down_bytes_total"]


def test_the_mirrors_match_the_server_cache_after_a_run_with_participation(tmp_path):
    loop = fit_loop(scarlet_args(tmp_path, *PARTIAL, duration=3, rounds=5))
    method = loop.server_side.method
    heard = [c for c in loop.view.clients if "cache_stored" in c.method_state]
    assert heard
    for client in heard:
        stored, labels = client.method_state["cache_stored"], client.method_state["cache_labels"]
        # a row the client's mirror counts as cached is the server's entry, stored in the same round
        held = cache_valid(stored, loop.round, 3)
        assert bool((method.cache_stored[held] == stored[held]).all())
        torch.testing.assert_close(labels[held], method.cache_labels[held])


def test_stopped_and_resumed_equals_an_uninterrupted_run(tmp_path):
    assert main(["fit", *scarlet_args(tmp_path / "straight", *PARTIAL, duration=2)]) == 0
    assert main(["fit", *scarlet_args(tmp_path / "stopped", *PARTIAL, duration=2, rounds=2)]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "4"]) == 0
    straight = only_run(tmp_path / "straight")
    assert read_jsonl(stopped / "communication.jsonl") == read_jsonl(straight / "communication.jsonl")
    resumed, uninterrupted = (without_time(read_jsonl(p / "metrics.jsonl")) for p in (stopped, straight))
    assert resumed == uninterrupted
    assert sum(m["scarlet/cached_rows"] for m in resumed[2:]) > 0  # the resumed rounds used the cache


def test_vectorized_equals_sequential(tmp_path):
    seq = fit_loop(scarlet_args(tmp_path / "seq", *PARTIAL, "--federation.executor", EXECUTORS["sequential"]))
    vec = fit_loop(scarlet_args(tmp_path / "vec", *PARTIAL, "--federation.executor", EXECUTORS["vectorized"]))
    assert ledger_rows(vec) == ledger_rows(seq)
    for a, b in zip(seq.history, vec.history, strict=True):
        for key, value in a.items():
            if isinstance(value, float) and not key.startswith(("time/", "ray/")):
                assert math.isclose(value, b[key], rel_tol=1e-5, abs_tol=1e-6) or (
                    math.isnan(value) and math.isnan(b[key])), key


@pytest.mark.parametrize("flag, value", [("cache_duration", "-1"), ("cache_ratio", "1.5"), ("era_exponent", "0")])
def test_bad_knobs_are_refused_in_one_line(flag, value, tmp_path, capsys):
    assert main(["fit", *scarlet_args(tmp_path, f"--aggregator.init_args.{flag}", value)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: aggregator.{flag}")
