"""Participation (client sampling, dropout, late joiners, per-round public subset): the draws, the
loop's use of them, and the rules that keep per-client or per-sample server state."""

import copy
import math

import pytest
import torch

from fdlit.configuration.schema import parse_fit
from fdlit.execution import steps
from fdlit.federation.participation import Participation
from fdlit.methods import FedGO, Oracle
from fdlit.methods.base import FederationInfo, ServerContext, context_for
from fdlit.runs.experiment import Experiment

SEQ, VEC = "fdlit.execution.SequentialExecutor", "fdlit.execution.VectorizedExecutor"


def tiny(*extra):
    return ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--federation.rounds", "2", "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
            "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "120",
            "--model", "fdlit.models.MLP", "--model.hidden", "[16]", *extra]


def make_loop(*extra):
    parser, cfg = parse_fit(tiny(*extra))
    return Experiment(cfg, parser).loop


# ---------------------------------------------------------------- the draws
def test_a_draw_depends_on_seed_and_round_only():
    p = Participation(fraction=0.5, dropout=0.3)
    draws = [p.draw(7, r, 20) for r in range(1, 31)]
    assert draws == [Participation(fraction=0.5, dropout=0.3).draw(7, r, 20) for r in range(1, 31)]  # no state
    assert [p.draw(7, r, 20) for r in range(30, 0, -1)] == draws[::-1]  # order of the calls does not matter
    assert len({tuple(s) for s, _ in draws}) > 20 and draws != [p.draw(8, r, 20) for r in range(1, 31)]
    for sampled, arrived in draws:
        assert len(sampled) == 10 and sampled == sorted(set(sampled)) and set(arrived) <= set(sampled)
    dropped = sum(len(s) - len(a) for s, a in draws) / sum(len(s) for s, _ in draws)
    assert 0.2 < dropped < 0.4  # about the dropout probability


def test_count_late_joiners_and_public_rows():
    assert len(Participation(count=3).draw(0, 1, 20)[0]) == 3
    assert Participation(fraction=0.3).draw(0, 1, 7)[0].__len__() == 3  # ceil(0.3 * 7)
    late = Participation(late_joiners=5, join_round=4)
    assert all(max(late.draw(0, r, 20)[0]) < 15 for r in (1, 2, 3))
    assert late.draw(0, 4, 20)[0] == list(range(20))
    assert Participation(join_rounds=[1, 3, 2]).draw(0, 2, 3)[0] == [0, 2]
    rows = Participation(public_subset=50).public_rows(0, 3, 120)
    assert len(rows) == 50 and list(rows) == sorted(set(rows.tolist())) and rows.max() < 120
    assert len(Participation(public_fraction=0.25).public_rows(0, 3, 120)) == 30
    assert Participation(public_subset=120).public_rows(0, 3, 120) is None  # N' = N: the whole set, in order


# ---------------------------------------------------------------- the loop
def comparable(history):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "participation/"))} for m in history]


@pytest.mark.parametrize("section", [("--federation.participation.fraction", "1.0"),
                                     ("--federation.participation.count", "4",
                                      "--federation.participation.public_subset", "120")])
def test_everyone_every_round_reproduces_a_run_without_the_section(section):
    """count = M and N' = N go through the sampled code path and must change nothing."""
    plain = make_loop("--federation.executor", VEC)
    plain.fit()
    full = make_loop("--federation.executor", VEC, *section)
    full.fit()
    assert comparable(full.history) == comparable(plain.history)
    assert full.server_side.ledger.messages == plain.server_side.ledger.messages


def states(loop):
    return [copy.deepcopy(c.client_state()) for c in loop.view.clients]


def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("executor", [SEQ, VEC])
def test_half_the_clients_the_ledger_shows_exactly_them_and_the_others_stay_untouched(executor):
    loop = make_loop("--federation.executor", executor, "--federation.participation.fraction", "0.5")
    loop.setup()
    ledger = loop.server_side.ledger
    for r in (1, 2):
        before = states(loop)
        metrics = loop.run_round(r)
        sampled = Participation(fraction=0.5).draw(loop.seed, r, 4)[0]
        assert metrics["participation/clients"] == metrics["participation/arrived"] == sampled
        for direction in ("up", "down"):
            assert {m.client for m in ledger.messages if m.round == r and m.direction == direction} == set(sampled)
        after = states(loop)
        for i in range(4):  # unsampled: model, optimizer state (Adam's step included) and generator as before
            assert same(before[i], after[i]) == (i not in sampled), (r, i)
    assert metrics["comm/up_bytes"] == sum(m.bytes for m in ledger.messages if m.round == 2 and m.direction == "up")


def test_dropped_clients_train_but_send_and_receive_nothing():
    loop = make_loop("--federation.executor", SEQ, "--federation.participation.dropout", "0.5",
                     "--federation.rounds", "3")
    loop.setup()
    seen_drop = False
    for r in (1, 2, 3):
        before = states(loop)
        metrics = loop.run_round(r)
        sampled, arrived = metrics["participation/clients"], metrics["participation/arrived"]
        assert sampled == [0, 1, 2, 3] and metrics["participation/dropped_count"] == 4 - len(arrived)
        assert {m.client for m in loop.server_side.ledger.messages if m.round == r} == set(arrived)
        after = states(loop)
        for i in sorted(set(sampled) - set(arrived)):  # trained its private phase all the same
            seen_drop = True
            assert not same(before[i]["model"], after[i]["model"])
    assert seen_drop


# ---------------------------------------------------------------- rules with per-client server state
def test_rules_with_server_state_use_the_arrived_clients_and_the_rounds_rows():
    torch.manual_seed(0)
    m, n, c = 4, 12, 3
    z = torch.randn(m, n, c)
    labels = torch.randint(0, c, (n,))
    holds = torch.rand(m, c) > 0.4
    ids, rows = (1, 3), torch.tensor([0, 2, 5, 7, 11])
    info = FederationInfo(1, 0, m, c, torch.zeros(len(rows), 2), clients=ids, public_index=rows)
    sub = [{"logits": z[i, rows]} for i in ids]

    oracle, small = Oracle(), Oracle()
    oracle.set_truth(labels, holds)
    small.set_truth(labels[rows], holds[list(ids)])
    assert torch.equal(oracle.aggregate(sub, ServerContext(info)).teacher, small.aggregate(sub, context_for(sub)).teacher)

    log_odds, counts = torch.randn(m, n), torch.tensor([5, 9, 2, 30])
    fedgo, small = FedGO(), FedGO()
    fedgo.set_discriminator_scores(log_odds, counts)
    small.set_discriminator_scores(log_odds[list(ids)][:, rows], counts[list(ids)])
    got = fedgo.aggregate(sub, ServerContext(info))
    assert torch.allclose(got.teacher, small.aggregate(sub, context_for(sub)).teacher) and got.weights.shape == (2, len(rows))


def test_sample_rate_is_the_largest_per_round_share():
    assert Participation().sample_rate == Participation(fraction=1.0).sample_rate == 1.0
    assert Participation(fraction=0.5).sample_rate_for(20) == 0.5
    assert Participation(fraction=0.3).sample_rate_for(7) == 3 / 7  # ceil(0.3 * 7) of 7
    assert Participation(count=3).sample_rate_for(12) == 0.25
    # 2 of the 4 clients from round 1: count 2 samples both of them then
    assert Participation(count=2, late_joiners=2, join_round=3).sample_rate_for(4) == 1.0
    p = Participation(count=5)
    with pytest.raises(RuntimeError, match="number of clients"):
        p.sample_rate
    p.check(20, 100)
    assert p.sample_rate == 0.25
    loop, full = make_loop("--federation.participation.count", "1"), make_loop()
    loop.setup()
    full.setup()
    assert loop.parts.facts.sample_rate == 0.25 and full.parts.facts.sample_rate == 1.0


def test_late_joiners_do_nothing_before_their_round():
    loop = make_loop("--federation.executor", VEC, "--federation.participation.late_joiners", "1",
                     "--federation.participation.join_round", "2")
    loop.setup()
    before = states(loop)
    metrics = loop.run_round(1)
    assert metrics["participation/clients"] == [0, 1, 2]
    assert {m.client for m in loop.server_side.ledger.messages if m.round == 1} == {0, 1, 2}
    assert same(before[3], states(loop)[3])  # not joined yet: untouched
    assert len(metrics["clients/after_public/global_acc"]) == 4  # but evaluated
    metrics = loop.run_round(2)
    assert metrics["participation/clients"] == [0, 1, 2, 3]
    assert {m.client for m in loop.server_side.ledger.messages if m.round == 2} == {0, 1, 2, 3}


# ---------------------------------------------------------------- parameter exchange
def test_fedavg_and_scaffold_with_half_the_clients_exchange_only_what_arrived():
    for method in ("fdlit.methods.FedAvg", "fdlit.methods.scaffold.Scaffold"):
        loop = make_loop("--aggregator", method, "--client.optimizer", "sgd", "--client.lr", "0.05",
                         "--federation.participation.fraction", "0.5")
        loop.fit()
        params = sum(p.numel() for p in loop.view.clients[0].model.parameters())
        per_model = 4 * params * (2 if "Scaffold" in method else 1)  # SCAFFOLD also sends a control variate
        for m in loop.history:
            arrived = m["participation/arrived"]
            assert len(arrived) == 2
            sent = [e for e in loop.server_side.ledger.messages if e.round == m["round"] and e.direction == "up"]
            assert {e.client for e in sent} == set(arrived)  # nobody else uploaded
            up = sum(e.bytes for e in sent)
            assert per_model * 2 <= up < per_model * 2 + 64
        # every client holds the same (global) model after the exchange
        first = torch.cat([p.flatten() for p in loop.view.clients[0].model.parameters()])
        for c in loop.view.clients[1:]:
            assert torch.equal(first, torch.cat([p.flatten() for p in c.model.parameters()]))
        if "Scaffold" in method:  # the server's control variate is the mean over all N clients' c_i
            cs = torch.stack([c.method_state["scaffold_c_i"] for c in loop.view.clients])
            torch.testing.assert_close(loop.server_side.method.control, cs.mean(0), rtol=1e-5, atol=1e-7)


def test_fedmd_with_a_per_round_public_subset_communicates_and_digests_only_those_rows():
    loop = make_loop("--aggregator", "fdlit.methods.FedMD",
                     "--federation.participation.public_subset", "50")
    loop.fit()
    for m in loop.history:
        sent = [e for e in loop.server_side.ledger.messages if e.round == m["round"]]
        assert {e.shape[0] for e in sent if e.kind in ("logits", "teacher")} == {50}
        assert m["participation/public_size"] == 50 and m["teacher/kept_fraction"] == 1.0


# ---------------------------------------------------------------- a node lost in the exchange (a deployment)
class LosesClientAtUpload:
    """Wraps an executor: from round 2's upload step on, client 1 cannot be reached (its node stopped
    answering: no reply), as a FlowerExecutor reports a SuperNode lost mid-round."""

    def __init__(self, inner):
        self.inner, self.lost = inner, frozenset()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _lose(self, info, clients, replies):
        if info.round >= 2:
            self.lost = frozenset({1})
            return [{} if c.client_id == 1 else r for c, r in zip(clients, replies, strict=True)]
        return replies

    def client_step(self, step):  # the round's client step ends in the upload (ClientStep)
        losses, replies = steps.client_step(self.inner, step)
        return losses, (self._lose(step.info, step.uploading, replies) if replies else replies)

    def unreachable(self):
        return self.lost


@pytest.mark.parametrize("config", ["digits.yaml", "digits_fedavg.yaml"])
def test_a_client_lost_during_the_upload_is_a_dropout_of_that_round(config):
    from fdlit.execution import SequentialExecutor

    parser, cfg = parse_fit(["--config", config, *tiny("--federation.rounds", "3")[2:]])
    loop = Experiment(cfg, parser).loop
    loop.settings.executor = LosesClientAtUpload(SequentialExecutor())
    loop.fit()
    first, second, third = loop.history
    assert "participation/dropped_count" not in first
    for metrics in (second, third):
        assert metrics["participation/arrived"] == [0, 2, 3] and metrics["participation/dropped_count"] == 1
    assert {m.client for m in loop.server_side.ledger.messages if m.round == 2 and m.direction == "up"} == {0, 2, 3}
    assert all(math.isfinite(m["after_public/global_acc_mean"]) for m in loop.history)
