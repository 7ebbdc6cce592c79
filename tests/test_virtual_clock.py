"""Rounds on a virtual clock: device profiles, staleness, synchronous deadlines, asynchronous FD."""

import json
import math

import numpy as np
import pytest
import torch

from fdlit.errors import ConfigError
from fdlit.federation.clock import Constant, Hinge, LogNormalProfile, Polynomial, TraceProfile, UniformProfile
from fdlit.federation.clock.staleness import stale_teacher, staleness_weighted
from fdlit.methods import ProbabilityAveraging
from fdlit.methods.era import EntropyReduction
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


# ---------------------------------------------------------------- profiles
def test_profiles_draw_from_the_seed_alone():
    equal = UniformProfile(speed_low=50, speed_high=50).draw(6, seed=3)
    assert set(equal.speed) == {50.0} and equal.compute_s(2, 500) == 10.0
    assert equal.link_s(0, 10 * 125_000) == pytest.approx(0.05 + 1.0)  # 10 Mbit/s: 1.25 MB in a second
    a, b = LogNormalProfile(speed_sigma=1.0).draw(2000, 7), LogNormalProfile(speed_sigma=1.0).draw(2000, 7)
    assert np.array_equal(a.speed, b.speed) and not np.array_equal(a.speed, LogNormalProfile().draw(2000, 8).speed)
    assert np.median(a.speed) == pytest.approx(100, rel=0.1)
    assert a.speed.max() / np.median(a.speed) > 10  # heavy tail: stragglers far from the median
    with pytest.raises(ConfigError, match="federation.clock.profile.speed_low"):
        UniformProfile(speed_low=5, speed_high=1)


def test_trace_profile_reads_fedscale_fields(tmp_path):
    trace = tmp_path / "devices.json"
    trace.write_text(json.dumps({
        "17": {"computation": 10.0, "communication": 800.0},
        "42": {"computation": 5.0, "communication": 8000.0, "active": [10, 50], "inactive": [20, 60],
               "finish_time": 100}}))
    devices = TraceProfile(str(trace)).draw(3, seed=0)
    assert devices.speed[0] == pytest.approx(1000 / 30) and devices.bandwidth[1] == 1_000_000  # kbit/s -> bytes/s
    assert devices.speed[2] == devices.speed[0]  # fewer devices than clients: wraps around
    assert devices.start(0, 15.0) == 15.0  # no windows: always available
    assert [devices.start(1, t) for t in (0, 15, 30, 55, 70, 115, 130)] == [10, 15, 50, 55, 110, 115, 150]
    trace.write_text(json.dumps({"1": {"computation": -1, "communication": 5}}))
    with pytest.raises(ConfigError, match="federation.clock.profile.path"):
        TraceProfile(str(trace))


# ---------------------------------------------------------------- staleness
def test_staleness_functions_are_fedasyncs():
    assert [Constant()(s) for s in (0, 5)] == [1.0, 1.0]
    assert Polynomial(a=0.5)(3) == pytest.approx(0.5) and Polynomial(a=0.5)(0) == 1.0
    hinge = Hinge(a=2, b=1)
    assert [hinge(0), hinge(1), hinge(3)] == [1.0, 1.0, pytest.approx(1 / 5)]
    with pytest.raises(ConfigError, match="federation.clock.staleness.a"):
        Polynomial(a=-1)


def test_staleness_multiplies_the_rules_weights_per_sample():
    w = torch.tensor([[0.5, 0.2], [0.5, 0.8]], dtype=torch.float64)
    f = torch.tensor([1.0, 0.5], dtype=torch.float64)
    out = staleness_weighted(w, f)
    assert torch.allclose(out, torch.tensor([[0.5 / 0.75, 0.2 / 0.6], [0.25 / 0.75, 0.4 / 0.6]], dtype=torch.float64))
    assert torch.equal(staleness_weighted(torch.zeros(2, 1), torch.ones(2)), torch.zeros(2, 1))  # rule's own column
    z = torch.randn(2, 3, 4)
    weights = staleness_weighted(torch.full((2, 3), 0.5), torch.tensor([1.0, 0.25]))
    avg = stale_teacher(ProbabilityAveraging(), weights, z)
    assert torch.allclose(avg, 0.8 * z[0].softmax(-1) + 0.2 * z[1].softmax(-1))
    era = stale_teacher(EntropyReduction(temperature=0.1), weights, z)
    assert torch.allclose(era, torch.softmax((0.8 * z[0].softmax(-1) + 0.2 * z[1].softmax(-1)) / 0.1, -1))


# ---------------------------------------------------------------- synchronous rounds
def test_no_clock_logs_no_time_and_a_synchronous_clock_changes_nothing_learned():
    plain = fitted("--federation.executor", VEC)
    timed = fitted("--federation.executor", VEC, *clock("SynchronousClock", profile=HETEROGENEOUS))
    assert not any("time/virtual_s" in m for m in plain.history)
    assert learning(timed.history) == learning(plain.history)
    times = [m["time/virtual_s"] for m in timed.history]
    assert all(b > a > 0 for a, b in zip(times, times[1:], strict=False)) and times[0] > 0
    assert all(m["async/staleness_max"] == 0 for m in timed.history)
    assert timed.server_side.ledger.messages == plain.server_side.ledger.messages


def test_a_deadline_drops_late_clients_and_releases_at_it():
    loop = fitted(*clock("SynchronousClock", profile=HETEROGENEOUS, deadline=1.0))
    first = loop.history[0]
    assert first["participation/sampled_count"] == 4 and first["participation/dropped_count"] >= 1
    assert first["time/virtual_s"] == pytest.approx(1.0)  # someone was late: the server waits out the deadline
    late = set(first["participation/clients"]) - set(first["participation/arrived"])
    assert all(loop.server_side.ledger.total("up", round=1, client=i) == 0 for i in late)  # their upload unused
    generous = fitted(*clock("SynchronousClock", profile=HETEROGENEOUS, deadline=1e9), rounds=1)
    assert generous.history[0]["participation/dropped_count"] == 0


# ---------------------------------------------------------------- asynchronous rounds
@pytest.mark.parametrize("executor", [SEQ, VEC])
def test_equal_devices_and_a_full_buffer_are_synchronous_rounds_to_the_bit(executor):
    sync = fitted("--federation.executor", executor)
    asyn = fitted("--federation.executor", executor,
                  *clock("AsynchronousClock", profile={"class_path": CLOCK + "UniformProfile"},
                         staleness={"class_path": CLOCK + "Polynomial", "init_args": {"a": 1.0}}))
    assert learning(asyn.history) == learning(sync.history)
    assert asyn.server_side.ledger.messages == sync.server_side.ledger.messages
    for a, b in zip(asyn.view.clients, sync.view.clients, strict=True):
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(p, q)


def test_a_buffer_releases_teachers_from_stale_cached_rows():
    loop = fitted(*clock("AsynchronousClock", profile=HETEROGENEOUS, buffer=2,
                         staleness={"class_path": CLOCK + "Polynomial", "init_args": {"a": 0.5}}), rounds=5)
    h = loop.history
    assert h[0]["async/arrivals"] == 4 and all(m["async/arrivals"] == 2 for m in h[1:])
    assert h[0]["async/staleness_max"] == 0 and max(m["async/staleness_max"] for m in h[1:]) >= 1
    assert all(m["async/staleness_mean"] > 0 for m in h[1:])
    per_client = h[0]["comm/up_bytes"] / 4
    assert all(m["comm/up_bytes"] == 2 * per_client for m in h[1:])  # only the arrivals upload
    times = [m["time/virtual_s"] for m in h]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))
    assert all(math.isfinite(m["teacher/acc"]) for m in h)


def test_a_period_releases_on_the_clock_and_staleness_changes_the_teacher():
    period = fitted(*clock("AsynchronousClock", profile=HETEROGENEOUS, period=2.0), rounds=4).history
    first = period[0]["time/virtual_s"]
    assert [m["time/virtual_s"] for m in period[1:]] == pytest.approx([first + 2.0 * k for k in (1, 2, 3)])
    assert period[0]["async/arrivals"] == 4 and all(m["async/arrivals"] <= 4 for m in period[1:])

    def teachers(staleness):
        loop = fitted(*clock("AsynchronousClock", profile=HETEROGENEOUS, buffer=1,
                             staleness={"class_path": CLOCK + staleness[0], "init_args": staleness[1]}), rounds=4)
        return [m["teacher/nll"] for m in loop.history], [m["async/staleness_max"] for m in loop.history]

    constant, stale = teachers(("Constant", {})), teachers(("Polynomial", {"a": 4.0}))
    assert constant[1] == stale[1] and max(stale[1]) >= 2  # the same arrivals, some rows stale
    assert constant[0][0] == stale[0][0]  # release 1: nothing is stale
    assert constant[0][1:] != stale[0][1:]  # later: the stale rows count less


def test_what_asynchronous_rounds_cannot_run_is_refused_in_one_line():
    code, lines = refusal("--federation.mode", "local_only", *clock("AsynchronousClock"))
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fdlit: error: federation.clock: ")
    code, lines = refusal("--aggregator", "fdlit.methods.CoordinateMedian",
                          *clock("AsynchronousClock", staleness={"class_path": CLOCK + "Hinge"}))
    assert code == 2 and lines == [lines[0]] and lines[0].startswith("fdlit: error: federation.clock.staleness: ")
    code, lines = refusal("--privacy.upload_audit", "true", *clock("AsynchronousClock"))
    assert code == 2 and lines == ["fdlit: error: privacy.upload_audit: allowed: false with AsynchronousClock"]
    code, lines = refusal(*clock("AsynchronousClock", buffer=9))
    assert code == 2 and lines[-1].startswith("fdlit: error: federation.clock.buffer: ")


# ---------------------------------------------------------------- the real entry point, kill and resume
def test_the_async_study_runs_through_the_entry_point(tmp_path):
    run = entry("fit", "--config", "configs/digits.yaml", "--config", "studies/async.yaml", "--logger.mode",
                "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path), "--federation.rounds", "3",
                "--federation.private_epochs_first", "1", "--data.num_clients", "6", "--data.public_size", "120")
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    (folder,) = tmp_path.iterdir()
    rows = read_jsonl(folder / "metrics.jsonl")
    assert [r["async/arrivals"] for r in rows] == [6, 5, 5]  # the study's buffer of 5
    assert rows[-1]["time/virtual_s"] > rows[0]["time/virtual_s"] > 0


@pytest.mark.parametrize("executor", [SEQ, VEC])
def test_sigkill_and_resume_equal_an_uninterrupted_asynchronous_run(tmp_path, executor):
    """The clock, the clients' timeline and the cached uploads are state: a run killed after a release
    and resumed releases the same teachers at the same virtual times."""
    rounds = 5
    args = ["fit", *tiny("--federation.executor", executor, "--seed", "3", "--federation.private_epochs", "3",
                         *clock("AsynchronousClock", profile=HETEROGENEOUS, buffer=2,
                                staleness={"class_path": CLOCK + "Hinge", "init_args": {"a": 1.0, "b": 0}}),
                         rounds=rounds)]
    (got, got_sent), (want, want_sent), _ = killed_and_resumed(args, tmp_path, 2, rounds)
    assert [r["round"] for r in got] == list(range(1, rounds + 1))
    assert [r["time/virtual_s"] for r in got] == [r["time/virtual_s"] for r in want]
    assert max(r["async/staleness_max"] for r in got) >= 1  # stale rows were in play across the kill
    assert learning(got) == learning(want)
    assert got_sent == want_sent
