"""client.optimizer_scope: one optimizer across phases and rounds (shared, the default), one per phase
kept across rounds, or one reset each round; each resumes exactly and vectorizes exactly."""

import math

import pytest
import torch

from fdlit.cli import main
from fdlit.clients.client import ClientModule
from fdlit.clients.options import ClientOptimization
from fdlit.runs import read_jsonl
from tests.fitting import EXECUTORS, fit_loop, only_run, tiny, without_time


def adam_steps(client):
    state = client.configure_optimizers().state
    return [int(s["step"]) for s in state.values()][:1] or [0]


def one_step(client, phase):
    client.set_phase(phase)
    optimizer = client.configure_optimizers()
    loss = client.model(torch.randn(4, 3)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("scope, expected", [
    ("shared", [1, 2, 3, 4, 5]),  # one state through every step
    ("per_phase", [1, 2, 1, 3, 2]),  # private: 1, 2, 3; public: 1, 2
    ("per_round", [1, 1, 2, 1, 2]),  # cleared whenever a (round's) private phase starts
])
def test_each_scope_keeps_the_optimizer_state_it_says(scope, expected):
    torch.manual_seed(0)
    client = ClientModule(torch.nn.Linear(3, 2), 0, [0, 1], ClientOptimization(optimizer_scope=scope))
    seen = []
    for phase in ("private", "private", "public", "private", "public"):
        one_step(client, phase)
        seen.append(adam_steps(client)[0])
    assert seen == expected


def test_per_phase_state_is_saved_with_the_client():
    torch.manual_seed(0)
    make = lambda: ClientModule(torch.nn.Linear(3, 2), 0, [0, 1], ClientOptimization(optimizer_scope="per_phase"))  # noqa: E731
    client = make()
    for phase in ("private", "private", "public"):
        one_step(client, phase)
    copy = make()
    copy.load_client_state(client.client_state())
    one_step(copy, "private")
    assert adam_steps(copy) == [3]


def test_shared_is_the_default_and_leaves_the_state_unchanged():
    client = ClientModule(torch.nn.Linear(3, 2), 0, [0, 1], ClientOptimization())
    assert client.optimization.optimizer_scope == "shared" and "optimizer_scope" not in client.client_state()


def args(tmp_path, scope, *extra, rounds=2):
    return tiny("digits_dsfl.yaml", tmp_path, "--client.optimizer_scope", scope, *extra, rounds=rounds)


def test_the_scope_changes_training_and_shared_equals_the_default(tmp_path):
    default = fit_loop(tiny("digits_dsfl.yaml", tmp_path / "default"))
    shared = fit_loop(args(tmp_path / "shared", "shared"))
    per_phase = fit_loop(args(tmp_path / "per_phase", "per_phase"))
    key = "after_public/global_acc_mean"
    assert [m[key] for m in default.history] == [m[key] for m in shared.history]
    assert [m["train/public_loss_mean"] for m in per_phase.history] != [m["train/public_loss_mean"] for m in shared.history]


@pytest.mark.parametrize("scope", ["per_phase", "per_round"])
def test_stopped_and_resumed_equals_an_uninterrupted_run(scope, tmp_path):
    assert main(["fit", *args(tmp_path / "straight", scope, rounds=3)]) == 0
    assert main(["fit", *args(tmp_path / "stopped", scope, rounds=1)]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "3"]) == 0
    straight = only_run(tmp_path / "straight")
    assert without_time(read_jsonl(stopped / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))


@pytest.mark.parametrize("scope", ["per_phase", "per_round"])
def test_vectorized_equals_sequential(scope, tmp_path):
    seq = fit_loop(args(tmp_path / "seq", scope, "--federation.executor", EXECUTORS["sequential"]))
    vec = fit_loop(args(tmp_path / "vec", scope, "--federation.executor", EXECUTORS["vectorized"]))
    assert vec.settings.executor.trained["sequential"] == 0
    for a, b in zip(seq.history, vec.history, strict=True):
        for key, value in a.items():
            if isinstance(value, float) and not key.startswith(("time/", "ray/")):
                assert math.isclose(value, b[key], rel_tol=1e-5, abs_tol=1e-5) or (
                    math.isnan(value) and math.isnan(b[key])), key


def test_an_unknown_scope_is_refused_in_one_line(tmp_path, capsys):
    assert main(["fit", *args(tmp_path, "per_epoch")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error:") and "optimizer_scope" in err[0]
