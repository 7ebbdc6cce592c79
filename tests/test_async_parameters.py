"""FedBuff and FedAsync: parameter exchange (FedAvg's family) on the asynchronous virtual clock."""

import json

import pytest
import torch

from fdlit.errors import ConfigError
from fdlit.federation.clock import FedAsync, FedBuff
from fdlit.methods import FedAvg
from fdlit.methods.contexts import context_for
from fdlit.methods.parameters import exchanged_tensors, flatten
from fdlit.runs import read_jsonl
from tests.clocked import (
    CLOCK,
    HETEROGENEOUS,
    SEQ,
    VEC,
    clock,
    entry,
    fitted,
    killed_and_resumed,
    learning,
    refusal,
    tiny,
)

FEDAVG = ("--config", "methods/fedavg.yaml")
FEDASYNC = {"class_path": CLOCK + "FedAsync", "init_args": {"alpha": 0.6}}


def same_learning(a, b) -> bool:
    """The learning metrics equal, a NaN (parameter exchange has no public loss) equal to a NaN."""
    return json.dumps(learning(a)) == json.dumps(learning(b))


def held_model(client) -> torch.Tensor:
    return flatten(exchanged_tensors(client.model))


# ---------------------------------------------------------------- the two updates by hand
def fedavg_rule(counts):
    """FedAvg's n_k-weighted mean over the buffer (its real aggregate), as the exchange hands it the vectors."""
    method = FedAvg()
    method.counts = torch.tensor(counts)

    def rule(vectors):
        uploads = [{"parameters": v} for v in vectors]
        return method.aggregate(uploads, context_for(uploads)).broadcast["parameters"]
    return rule


def test_a_fedbuff_step_adds_the_staleness_scaled_deltas_mean_by_hand():
    current = torch.tensor([1.0, 2.0])  # x_t, t = 3
    bases = [torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])]  # client 0 from x_3 (s = 0), client 1 from x_1 (s = 2)
    uploads = [torch.tensor([2.0, 2.0]), torch.tensor([1.0, 3.0])]
    factors = [1.0, 0.5]  # f(0) = 1, f(2) = 0.5 (Hinge(a=0.5, b=0))
    # deltas: [1, 0] * 1 and [1, 3] * 0.5 = [0.5, 1.5]; n = (1, 3): mean = 0.25 [1, 0] + 0.75 [0.5, 1.5] = [0.625, 1.125]
    # x_4 = x_3 + 0.8 * [0.625, 1.125] = [1.5, 2.9]
    got = FedBuff(server_lr=0.8).step(current, uploads, bases, [0, 2], factors, fedavg_rule([1, 3]))
    assert torch.allclose(got, torch.tensor([1.5, 2.9]))
    # every upload fresh and eta_g = 1: the rule's own mean of the models, to the bit
    fresh = FedBuff().step(current, uploads, [current, current], [0, 0], [1.0, 1.0], fedavg_rule([1, 3]))
    assert torch.equal(fresh, fedavg_rule([1, 3])(uploads))
    assert torch.allclose(fresh, torch.tensor([1.25, 2.75]))


def test_a_fedasync_mix_moves_alpha_times_the_staleness_factor_toward_the_arrival_by_hand():
    current, arrival = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 2.0])
    # alpha_t = 0.6 * f(s) = 0.6 * 0.5 = 0.3: x = 0.7 [1, -2] + 0.3 [3, 2] = [1.6, -0.8]
    got = FedAsync(alpha=0.6).step(current, [arrival], [torch.zeros(2)], [3], [0.5], rule=None)
    assert torch.allclose(got, torch.tensor([1.6, -0.8]))
    assert torch.equal(FedAsync(alpha=1.0).step(current, [arrival], [current], [0], [1.0], None), arrival)
    with pytest.raises(ConfigError, match="federation.clock.server_update.alpha"):
        FedAsync(alpha=1.5)
    with pytest.raises(ConfigError, match="federation.clock.server_update.server_lr"):
        FedBuff(server_lr=0)


# ---------------------------------------------------------------- exact with equal devices and a full buffer
@pytest.mark.parametrize("executor", [SEQ, VEC])
def test_fedbuff_with_equal_devices_and_a_full_buffer_is_synchronous_fedavg_to_the_bit(executor):
    sync = fitted("--federation.executor", executor, *FEDAVG)
    asyn = fitted("--federation.executor", executor, *FEDAVG,
                  *clock("AsynchronousClock", profile={"class_path": CLOCK + "UniformProfile"},
                         staleness={"class_path": CLOCK + "Polynomial", "init_args": {"a": 1.0}},
                         server_update={"class_path": CLOCK + "FedBuff", "init_args": {"server_lr": 1.0}}))
    assert same_learning(asyn.history, sync.history)
    assert asyn.server_side.ledger.messages == sync.server_side.ledger.messages
    for a, b in zip(asyn.view.clients, sync.view.clients, strict=True):
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(p, q)
    assert [m["async/arrivals"] for m in asyn.history] == [4, 4, 4]
    times = [m["time/virtual_s"] for m in asyn.history]
    assert all(b > a > 0 for a, b in zip(times, times[1:], strict=False))


# ---------------------------------------------------------------- heterogeneous devices
def test_fedbuff_sends_the_new_model_only_to_the_arrived_and_takes_deltas_from_each_clients_base():
    loop = fitted(*FEDAVG, *clock("AsynchronousClock", profile=HETEROGENEOUS, buffer=2,
                                  staleness={"class_path": CLOCK + "Polynomial", "init_args": {"a": 0.5}},
                                  server_update={"class_path": CLOCK + "FedBuff", "init_args": {"server_lr": 0.9}}),
                  rounds=6)
    h, versions = loop.history, loop.clock.versions
    assert [m["async/arrivals"] for m in h] == [2] * 6  # parameter exchange: release 1 needs no full cache
    assert max(m["async/staleness_max"] for m in h) >= 1
    per_model = loop.server_side.ledger.total("down", round=1) / 2
    assert all(loop.server_side.ledger.total("down", round=r) == 2 * per_model for r in range(1, 7))
    assert versions.current == 6 and torch.equal(versions.models[6], loop.server_side.received["parameters"])
    for i, client in enumerate(loop.view.clients):  # every client holds the version the server says it does
        assert torch.equal(held_model(client), versions.models[versions.held[i]].to(held_model(client)))
    assert set(versions.models) == {*versions.held.values(), 6}  # no model kept that no client holds


def test_fedasync_mixes_one_arrival_a_release():
    loop = fitted(*FEDAVG, *clock("AsynchronousClock", profile=HETEROGENEOUS, buffer=1, server_update=FEDASYNC),
                  rounds=5)
    assert [m["async/arrivals"] for m in loop.history] == [1] * 5
    assert max(m["async/staleness_max"] for m in loop.history) >= 1
    times = [m["time/virtual_s"] for m in loop.history]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))


def test_fedbuff_on_a_period_updates_the_model_only_when_something_arrived():
    loop = fitted(*FEDAVG, *clock("AsynchronousClock", profile=HETEROGENEOUS, period=0.5), rounds=6)
    h = loop.history
    assert [m["time/virtual_s"] for m in h] == pytest.approx([0.5 * k for k in range(1, 7)])
    arrivals = [m["async/arrivals"] for m in h]
    assert 0 in arrivals and sum(arrivals) > 0  # some periods heard nobody
    assert loop.clock.versions.current == sum(1 for a in arrivals if a)  # an empty period leaves the model
    assert all(loop.server_side.ledger.total("down", round=r + 1) == 0 for r, a in enumerate(arrivals) if not a)


# ---------------------------------------------------------------- refusals in one line
@pytest.mark.parametrize("args, line", [
    (("--config", "methods/scaffold.yaml", *clock("AsynchronousClock")), "fdlit: error: federation.clock: "),
    ((*FEDAVG, *clock("AsynchronousClock", buffer=2, server_update=FEDASYNC)),
     "fdlit: error: federation.clock.buffer: allowed: 1 with FedAsync"),
    (("--config", "methods/fedmedian.yaml", *clock("AsynchronousClock", buffer=1, server_update=FEDASYNC)),
     "fdlit: error: federation.clock.server_update: "),
    (clock("AsynchronousClock", server_update=FEDASYNC), "fdlit: error: federation.clock.server_update: allowed: null"),
    ((*FEDAVG, "--federation.participation.fraction", "0.5", *clock("AsynchronousClock")),
     "fdlit: error: federation.participation: "),
    ((*FEDAVG, "--privacy.secure_aggregation", "true", *clock("AsynchronousClock")),
     "fdlit: error: privacy.secure_aggregation: "),
])
def test_what_asynchronous_parameter_exchange_cannot_run_is_refused_in_one_line(args, line):
    code, lines = refusal(*args)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(line), lines


# ---------------------------------------------------------------- kill and resume
# each update under one executor: both executors and both updates, each kill-and-resume two interpreter starts
@pytest.mark.parametrize("executor, update", [(VEC, "FedBuff"), (SEQ, "FedAsync")])
def test_sigkill_and_resume_equal_an_uninterrupted_fedbuff_and_fedasync_run(tmp_path, executor, update):
    """The server's model versions and each client's base version are state: a run killed after a
    release and resumed takes the same deltas and releases the same models."""
    rounds = 6
    updates = {"FedBuff": ({"class_path": CLOCK + "FedBuff", "init_args": {"server_lr": 0.9}}, 2, "3"),
               "FedAsync": (FEDASYNC, 1, "1")}  # seeds whose devices leave stale clients after release 3
    server_update, buffer, seed = updates[update]
    args = ["fit", *tiny(*FEDAVG, "--federation.executor", executor, "--seed", seed, "--federation.private_epochs", "3",
                         *clock("AsynchronousClock", profile=HETEROGENEOUS, buffer=buffer, server_update=server_update,
                                staleness={"class_path": CLOCK + "Hinge", "init_args": {"a": 1.0, "b": 0}}),
                         rounds=rounds)]
    (got, got_sent), (want, want_sent), killed_at = killed_and_resumed(args, tmp_path, 3, rounds)
    assert [r["round"] for r in got] == list(range(1, rounds + 1))
    assert [r["time/virtual_s"] for r in got] == [r["time/virtual_s"] for r in want]
    assert max(r["async/staleness_max"] for r in got[killed_at:]) >= 1  # stale bases in play after the kill
    assert same_learning(got, want)
    assert got_sent == want_sent


# ---------------------------------------------------------------- the study and its label
def test_the_fedbuff_study_runs_through_the_entry_point(tmp_path):
    run = entry("fit", "--config", "configs/digits.yaml", "--config", "methods/fedavg.yaml", "--config",
                "studies/async_fedbuff.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
                "--logger.run_dir", str(tmp_path), "--federation.rounds", "3", "--federation.eval_every_n_rounds", "1",
                "--federation.private_epochs_first", "1", "--data.num_clients", "12", "--data.public_size", "120")
    _, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    (folder,) = tmp_path.iterdir()
    rows = read_jsonl(folder / "metrics.jsonl")
    assert [r["async/arrivals"] for r in rows] == [10, 10, 10]  # the study's buffer of 10
    assert rows[-1]["time/virtual_s"] > rows[0]["time/virtual_s"] > 0
    assert rows[-1]["after_public/global_acc_mean"] > 0.1


def test_a_runs_label_names_its_server_update():
    from fdlit.reporting.labels import method_label

    def label(update):
        clock_ = {"class_path": CLOCK + "AsynchronousClock", "init_args": {"buffer": 1, "server_update": update}}
        return method_label({"aggregator": {"class_path": "fdlit.methods.FedAvg"}, "federation": {"clock": clock_}})

    assert label(FEDASYNC) == "FedAvg, async buffer 1, constant, FedAsync α=0.6"
    assert label({"class_path": CLOCK + "FedBuff"}) == "FedAvg, async buffer 1, constant, FedBuff η=1"
    assert label(None) == "FedAvg, async buffer 1, constant, FedBuff η=1"  # null: FedBuff, as the run ran
