"""FedTGP, FedGH and LG-FedAvg end to end, on their shipped digits configs (two client architectures):
``python -m fdlit fit`` runs each; the vectorized executor trains as the sequential one; a run stopped
by Ctrl-C resumes to the uninterrupted run's numbers and messages; each also runs with one shared
architecture; secure aggregation and DP run or are refused in one line before any work; and the
architectures each refuses are refused before round 1 in one line."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fdlit.callbacks import FederationCallback
from fdlit.cli import main
from fdlit.clients.features import split_network
from fdlit.configuration.schema import parse_fit
from fdlit.runs import read_jsonl
from fdlit.runs.experiment import Experiment
from tests.fitting import fit_loop

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ["digits_fedtgp.yaml", "digits_fedgh.yaml", "digits_lg_fedavg.yaml"]
LABELS = {"digits_fedtgp.yaml": "FedTGP", "digits_fedgh.yaml": "FedGH", "digits_lg_fedavg.yaml": "LG-FedAvg"}
# the shipped configs' two networks, narrowed: one penultimate width (16)
MIXED = json.dumps([{"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32, 16]}, "fraction": 0.5},
                    {"class_path": "fdlit.models.SmallCNN", "init_args": {"channels": 4, "hidden": 16}, "fraction": 0.5}])
SERVER = {"digits_fedtgp.yaml": ["--aggregator.server_epochs", "5"], "digits_fedgh.yaml": ["--aggregator.server_epochs", "5"],
          "digits_lg_fedavg.yaml": []}


def small(config, run_dir, *extra, rounds=3):
    """The shipped config with tiny settings; its PerClient model kept, its networks narrowed."""
    return ["--config", config, "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(run_dir), "--federation.rounds", str(rounds),
            "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
            "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "0",
            "--model.groups", MIXED, *SERVER[config], *extra]


def only_run(parent: Path) -> Path:
    (run,) = [p for p in parent.iterdir() if p.is_dir()]
    return run


def without_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize("config", CONFIGS)
def test_the_shipped_config_is_two_architectures_and_runs_through_the_command_line(config, tmp_path):
    _, cfg = parse_fit(["--config", config])
    groups = cfg.model.init_args.groups
    assert cfg.model.class_path == "fdlit.models.PerClient" and len({g["class_path"] for g in groups}) >= 2
    argv = [sys.executable, "-m", "fdlit", "fit", *small(config, tmp_path, rounds=2)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = only_run(tmp_path)
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["after_public/global_acc_mean"]) for r in rows)
    assert json.loads((run / "summary.json").read_text())["finished"]
    kinds = {r["kind"] for r in read_jsonl(run / "communication.jsonl")}
    assert "parameters" not in kinds and "logits" not in kinds  # neither whole networks nor predictions travel


@pytest.mark.parametrize("config", CONFIGS)
def test_the_vectorized_executor_trains_each_architecture_stacked_as_the_sequential_one(config, tmp_path):
    # SGD: Adam widens the CNNs' grouped convolution rounding (docs/vectorized-executor.md)
    sgd = ("--client.optimizer", "sgd")
    seq = fit_loop(small(config, tmp_path / "seq", "--federation.executor", "fdlit.execution.SequentialExecutor", *sgd))
    vec = fit_loop(small(config, tmp_path / "vec", "--federation.executor", "fdlit.execution.VectorizedExecutor", *sgd))
    nets = [type(split_network(c.model)[1]).__name__ for c in vec.view.clients]
    assert nets == ["MLP", "MLP", "SmallCNN", "SmallCNN"]
    assert vec.settings.executor.trained == {"vectorized": 4 * 3, "sequential": 0}  # two stacks a round
    for a, b in zip(seq.view.clients, vec.view.clients, strict=True):
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    for a, b in zip(seq.history, vec.history, strict=True):
        assert a["after_public/global_acc_mean"] == pytest.approx(b["after_public/global_acc_mean"], abs=1e-3)
    assert [m.shape for m in seq.server_side.ledger.messages] == [m.shape for m in vec.server_side.ledger.messages]


class StopAtRound3(FederationCallback):
    def on_round_start(self, loop, round):
        if round == 3:
            raise KeyboardInterrupt


@pytest.mark.parametrize("config", CONFIGS)
def test_a_run_interrupted_after_two_rounds_resumes_to_the_uninterrupted_run(config, tmp_path, monkeypatch, capsys):
    """The server's state (FedTGP's prototypes network, FedGH's head, LG-FedAvg's counts) changed in
    rounds 1 and 2 comes back from the checkpoint, so round 3 is the uninterrupted run's."""
    assert main(["fit", *small(config, tmp_path / "straight")]) == 0
    original = Experiment.__init__

    def stopping(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.loop.callbacks.append(StopAtRound3())

    monkeypatch.setattr(Experiment, "__init__", stopping)
    assert main(["fit", *small(config, tmp_path / "stopped")]) == 130
    assert capsys.readouterr().err.startswith("fdlit: interrupted; ")
    monkeypatch.undo()
    stopped = only_run(tmp_path / "stopped")
    assert [r["round"] for r in read_jsonl(stopped / "metrics.jsonl")] == [1, 2]
    assert main(["fit", "--resume", str(stopped)]) == 0
    straight = only_run(tmp_path / "straight")
    assert without_time(read_jsonl(stopped / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))
    assert read_jsonl(stopped / "communication.jsonl") == read_jsonl(straight / "communication.jsonl")


@pytest.mark.parametrize("config", CONFIGS)
def test_each_runs_with_one_shared_architecture(config, tmp_path):
    loop = fit_loop([*small(config, tmp_path, rounds=2), "--model", "fdlit.models.MLP", "--model.hidden", "[16]"])
    assert {type(split_network(c.model)[1]).__name__ for c in loop.view.clients} == {"MLP"} and loop.round == 2
    assert loop.server_side.ledger.total("up", round=2) > 0


SECURE = ("--privacy.secure_aggregation", "true")
DP = ("--privacy.noise_multiplier", "1.0", "--privacy.clip_norm", "5.0")


@pytest.mark.parametrize("config", CONFIGS)
def test_dp_is_refused_in_one_line_before_any_work(config, tmp_path, capsys):
    assert main(["fit", *small(config, tmp_path, *DP)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: privacy.") and LABELS[config].replace("-", "") in \
        err[0].replace("-", "")
    assert not list(tmp_path.rglob("metrics.jsonl"))


@pytest.mark.parametrize("config", ["digits_fedtgp.yaml", "digits_fedgh.yaml"])
def test_secure_aggregation_of_a_server_trained_on_each_upload_is_refused_in_one_line(config, tmp_path, capsys):
    assert main(["fit", *small(config, tmp_path, *SECURE)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: privacy.secure_aggregation: ")
    assert "needs each one, not their sum" in err[0]
    assert not list(tmp_path.rglob("metrics.jsonl"))


def test_lg_fedavg_under_secure_aggregation_equals_the_plain_run(tmp_path):
    plain = fit_loop(small("digits_lg_fedavg.yaml", tmp_path / "plain", rounds=2))
    masked = fit_loop(small("digits_lg_fedavg.yaml", tmp_path / "masked", *SECURE, rounds=2))
    assert any(m.kind.startswith("secagg") for m in masked.server_side.ledger.messages)
    for a, b in zip(plain.view.clients, masked.view.clients, strict=True):
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)  # within the fixed-point error


WIDER = json.dumps([{"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}, "fraction": 0.5},
                    {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}, "fraction": 0.5}])


@pytest.mark.parametrize("config", CONFIGS)
def test_networks_of_different_widths_are_refused_at_set_up_in_one_line(config, tmp_path, capsys):
    assert main(["fit", *small(config, tmp_path), "--model.groups", WIDER]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: model: {LABELS[config]} exchanges ")
    assert err[0].endswith("got widths [16, 32]")
    assert not [p for p in tmp_path.rglob("metrics.jsonl") if p.read_text().strip()]  # no round ran


class DeepHead(torch.nn.Module):
    """embed / classify, but a two-layer head: no single output layer to exchange."""

    def __init__(self, input_shape=None, num_classes=None):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(math.prod(input_shape), 16), torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, num_classes))

    def forward(self, x):
        return self.classify(self.embed(x))

    def embed(self, x):
        return self.body(x)

    def classify(self, features):
        return self.head(features)


class NoSplit(torch.nn.Module):
    def __init__(self, input_shape=None, num_classes=None):
        super().__init__()
        self.fc = torch.nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x):
        return self.fc(x.flatten(1))


@pytest.mark.parametrize(("config", "network", "said"), [
    ("digits_lg_fedavg.yaml", "DeepHead", "model: LG-FedAvg exchanges the output layer, so DeepHead.classify must be one"),
    ("digits_fedgh.yaml", "DeepHead", "model: FedGH exchanges the output layer, so DeepHead.classify must be one"),
    ("digits_fedgh.yaml", "NoSplit", "model: FedGH exchanges each client's output layer"),
    ("digits_fedtgp.yaml", "NoSplit", "model: FedTGP reads each step's penultimate features"),
])
def test_a_network_the_method_cannot_read_is_refused_before_round_1(config, network, said, tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    argv = [*small(config, tmp_path), "--model", f"test_heterogeneous_methods.{network}"]
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: {said}"), err
    assert not [p for p in tmp_path.rglob("metrics.jsonl") if p.read_text().strip()]


def test_fedtgp_with_weight_zero_trains_each_client_as_alone(tmp_path):
    """lambda = 0: the prototypes travel and arrive, but the clients train exactly as without them."""
    off = fit_loop(small("digits_fedtgp.yaml", tmp_path / "off", "--aggregator.lam", "0", rounds=2))
    alone = fit_loop(small("digits_fedtgp.yaml", tmp_path / "alone", "--federation.mode", "local_only", rounds=2))
    assert alone.server_side.ledger.messages == [] and "proto_global" in off.view.clients[0].method_state
    for a, b in zip(off.view.clients, alone.view.clients, strict=True):
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(p, q)
    on = fit_loop(small("digits_fedtgp.yaml", tmp_path / "on", rounds=2))
    assert not torch.equal(next(on.view.clients[0].model.parameters()), next(off.view.clients[0].model.parameters()))
