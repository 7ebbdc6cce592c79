"""Checkpoints and resume, determinism, numerical faults, bad input, tracker faults."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fdlit.callbacks import FederationCallback
from fdlit.cli import main
from fdlit.configuration.schema import parse_fit
from fdlit.federation import NumericalFault
from fdlit.messages import Message
from fdlit.methods import UncertaintyWeighted
from fdlit.methods.base import context_for
from fdlit.methods.density import DiagonalGaussianMixture
from fdlit.runs import read_jsonl
from fdlit.runs.checkpoint import (
    CheckpointError,
    checkpoint_state,
    load_checkpoint,
    pack_client_states,
    save_checkpoint,
    unpack_client_states,
)
from fdlit.runs.directory import CHECKPOINT as CHECKPOINT_NAME
from fdlit.runs.experiment import Experiment
from tests.fitting import kill_once_checkpointed

REPO = Path(__file__).resolve().parents[1]


def strip_timing(rows):
    """Everything except wall-clock measurements must match exactly."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def only_run(parent: Path) -> Path:
    (run,) = [p for p in Path(parent).iterdir() if p.is_dir()]
    return run


# ---------------------------------------------------------------------------------- SIGKILL + resume
def test_sigkill_mid_round_then_resume_matches_uninterrupted(tmp_path):
    rounds = 5
    args = [
        "fit", "--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
        "--federation.rounds", str(rounds), "--federation.private_epochs_first", "2",
        "--federation.private_epochs", "4", "--federation.public_epochs_first", "1", "--federation.public_epochs", "2",
        "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "200", "--seed", "7",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "fdlit"]
    victim = subprocess.Popen([*cmd, *args, "--logger.run_dir", str(tmp_path / "victim")], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = kill_once_checkpointed(victim, tmp_path / "victim", 2, timeout=240)
    assert run is not None, "victim never finished round 2"
    killed_at = load_checkpoint(run)["loop"]["round"]
    rows_at_kill = len(read_jsonl(run / "metrics.jsonl"))
    assert 2 <= killed_at < rounds and rows_at_kill < rounds, "the kill must land before the run finished"
    assert not json.loads((run / "summary.json").read_text())["finished"]

    resume = subprocess.Popen([*cmd, "fit", "--resume", str(run)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    # the uninterrupted reference runs in this process meanwhile, on one thread like the subprocesses
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*args, "--logger.run_dir", str(tmp_path / "ref")]) == 0
    finally:
        torch.set_num_threads(threads)
    ref_run = only_run(tmp_path / "ref")
    out, err = resume.communicate(timeout=240)
    assert resume.returncode == 0, err
    print(f"killed after round {killed_at} with {rows_at_kill} metric rows written")
    assert f"resuming {run} after round {killed_at}" in err

    resumed, reference = read_jsonl(run / "metrics.jsonl"), read_jsonl(ref_run / "metrics.jsonl")
    assert [r["round"] for r in resumed] == list(range(1, rounds + 1))
    assert strip_timing(resumed) == strip_timing(reference)
    assert read_jsonl(run / "communication.jsonl") == read_jsonl(ref_run / "communication.jsonl")
    final = json.loads((run / "summary.json").read_text())
    final_ref = json.loads((ref_run / "summary.json").read_text())
    assert final["finished"] and final["final_global_acc_mean"] == final_ref["final_global_acc_mean"]
    a, b = load_checkpoint(run)["loop"], load_checkpoint(ref_run)["loop"]
    for ca, cb in zip(a["clients"], b["clients"], strict=True):
        for key in ca["model"]:
            assert torch.equal(ca["model"][key], cb["model"][key])


# ---------------------------------------------------------------------------------- numerical faults
class PoisonClient1Round2(FederationCallback):
    def on_round_start(self, loop, round):
        if round == 2:
            with torch.no_grad():
                next(loop.clients[1].parameters()).fill_(float("nan"))


def test_nan_in_one_client_names_it_and_the_previous_checkpoint_resumes(fast_args, tmp_path, capsys):
    parser, cfg = parse_fit(fast_args)
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    loop.callbacks.append(PoisonClient1Round2())
    with pytest.raises(NumericalFault) as info:
        experiment.run()
    text = str(info.value)
    assert "client 1" in text and "round 2" in text and "phase 'private'" in text
    assert f"fit --resume {experiment.run_path}" in text and "checkpoint of round 1 is intact" in text
    run = experiment.run_path
    assert load_checkpoint(run)["loop"]["round"] == 1
    # a kill between the metrics write and the checkpoint write leaves a later row and a torn line
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"round": 2, "after_public/global_acc_mean": 0.0}) + "\n" + '{"round": 3, "tor')
    with open(run / "communication.jsonl", "a") as f:
        f.write(json.dumps({"round": 2, "client": 0, "direction": "up", "kind": "logits", "bytes": 1}) + "\n")

    assert main(["fit", "--resume", str(run)]) == 0
    assert main(["fit", *fast_args, "--logger.run_dir", str(tmp_path / "ref")]) == 0
    ref = only_run(tmp_path / "ref")
    assert strip_timing(read_jsonl(run / "metrics.jsonl")) == strip_timing(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(run / "communication.jsonl") == read_jsonl(ref / "communication.jsonl")


def test_nan_through_the_cli_exits_3_and_says_where_to_resume(fast_args, tmp_path, capsys, monkeypatch):
    original = Experiment.__init__

    def poisoned(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.loop.callbacks.append(PoisonClient1Round2())

    monkeypatch.setattr(Experiment, "__init__", poisoned)
    assert main(["fit", *fast_args]) == 3
    err = capsys.readouterr().err
    assert "numerical fault: client 1 produced NaN/inf in round 2, phase 'private'" in err
    assert "fit --resume" in err


# ---------------------------------------------------------------------------------- safe loading
class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_checkpoint_with_a_pickled_object_is_refused_and_runs_no_code(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / CHECKPOINT_NAME
    torch.save({"format": "fdlit-checkpoint", "version": 2, "payload": RunsCode(marker)}, path)
    with pytest.raises(CheckpointError, match="refusing to load .* contains a pickled object"):
        load_checkpoint(path)
    assert not marker.exists()


def test_a_failed_write_leaves_the_last_good_checkpoint(fast_args, tmp_path, monkeypatch):
    parser, cfg = parse_fit(fast_args)
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    experiment.fit()
    path = experiment.run_path / CHECKPOINT_NAME
    before = path.read_bytes()

    def dies_mid_write(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # stands in for a kill during the write

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(checkpoint_state(loop, experiment.config), path)
    assert path.read_bytes() == before
    assert load_checkpoint(experiment.run_path)["loop"]["round"] == 2


# ---------------------------------------------------------------------------------- checkpoint format
def assert_same_state(a, b, where="state"):
    """Equal structure, container types, plain values, and tensors equal in dtype, shape and bits."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b or (a != a and b != b), where  # NaN equals NaN here


HETERO = ('[{"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}, "fraction": 0.5},'
          ' {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [8, 8]}, "fraction": 0.5}]')


def test_packed_checkpoint_is_a_few_large_tensors_and_loads_bit_identically(fast_args, tmp_path):
    """Two architectures, six clients: two groups, each state tensor stacked once per group; loading
    gives the loop's per-client states back exactly (types, metadata, plain values, bits)."""
    parser, cfg = parse_fit([*fast_args, "--data.num_clients", "6", "--data.classes_per_client", "2",
                             "--model", "fdlit.models.PerClient", "--model.groups", HETERO, "--federation.rounds", "1",
                             "--federation.executor", "fdlit.execution.VectorizedExecutor"])
    experiment = Experiment(cfg, parser)
    experiment.fit()
    loop = experiment.loop
    path = tmp_path / "ckpt.pt"
    save_checkpoint(checkpoint_state(loop, experiment.config), path)
    raw = torch.load(path, weights_only=True)
    assert raw["version"] == 4  # packed (3) and checksummed (4)
    groups = raw["loop"]["clients"]["groups"]
    assert [g["clients"] for g in groups] == [[0, 1, 2], [3, 4, 5]]
    per_client = [sum(isinstance(t, torch.Tensor) for t in pack_client_states([st])["groups"][0]["tensors"])
                  for st in (loop.view.clients[0].client_state(), loop.view.clients[3].client_state())]
    assert [len(g["tensors"]) for g in groups] == per_client  # one stacked tensor per state tensor, not per client
    assert all(t.shape[0] == 3 for g in groups for t in g["tensors"])
    assert_same_state(load_checkpoint(path)["loop"]["clients"], loop.state_dict()["clients"])


def test_packing_groups_clients_that_differ_and_unpacked_tensors_are_their_own(fast_args):
    parser, cfg = parse_fit([*fast_args, "--federation.rounds", "1"])
    loop = Experiment(cfg, parser).loop
    loop.fit()
    states = loop.state_dict()["clients"]
    fresh = type(loop.view.clients[0])(loop.view.clients[0].model, 9, [0], loop.optimization)  # no optimizer step yet
    states.insert(1, fresh.client_state())
    states[2]["method"] = {"mask": torch.ones(3, dtype=torch.bool)}
    packed = pack_client_states(states)
    assert [g["clients"] for g in packed["groups"]] == [[0, 3, 4], [1], [2]]
    unpacked = unpack_client_states(packed)
    assert_same_state(unpacked, states)
    weight = next(iter(unpacked[0]["model"].values()))
    assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()  # not a view of the stack


def test_a_version_2_checkpoint_of_per_client_states_still_loads(fast_args, tmp_path):
    parser, cfg = parse_fit([*fast_args, "--federation.rounds", "1"])
    experiment = Experiment(cfg, parser)
    experiment.fit()
    state = checkpoint_state(experiment.loop, experiment.config)
    state["version"] = 2
    state["loop"]["clients"] = unpack_client_states(state["loop"]["clients"])
    save_checkpoint(state, tmp_path / CHECKPOINT_NAME)
    assert_same_state(load_checkpoint(tmp_path)["loop"]["clients"], experiment.loop.state_dict()["clients"])


def test_every_n_rounds_and_keep_then_resume_from_an_older_checkpoint_is_bit_identical(fast_args, tmp_path,
                                                                                        monkeypatch):
    """Checkpoints after rounds 2, 4 and 5 (the last), the last two kept. A kill during round 5's
    write leaves round 4's: resuming repeats round 5 and ends exactly like a run checkpointed every round."""
    five = ["--federation.rounds", "5", "--data.public_size", "100"]
    assert main(["fit", *fast_args, "--logger.run_dir", str(tmp_path / "every"), *five]) == 0
    import fdlit.runs.checkpoint as ckpt

    saved, original = [], ckpt.save_checkpoint
    monkeypatch.setattr(ckpt, "save_checkpoint",
                        lambda state, path: (saved.append(state["loop"]["round"]), original(state, path))[1])
    assert main(["fit", *fast_args, "--logger.run_dir", str(tmp_path / "sparse"), *five,
                 "--checkpoint.every_n_rounds", "2", "--checkpoint.keep", "2"]) == 0
    monkeypatch.undo()
    assert saved == [2, 4, 5]
    run = only_run(tmp_path / "sparse")
    assert sorted(p.name for p in run.glob("checkpoint*.pt")) == ["checkpoint-r4.pt", "checkpoint-r5.pt",
                                                                  "checkpoint.pt"]
    assert load_checkpoint(run / "checkpoint-r4.pt")["loop"]["round"] == 4
    shutil.copyfile(run / "checkpoint-r4.pt", run / CHECKPOINT_NAME)  # round 5 ran, its checkpoint never landed
    assert main(["fit", "--resume", str(run)]) == 0
    ref = only_run(tmp_path / "every")
    assert strip_timing(read_jsonl(run / "metrics.jsonl")) == strip_timing(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(run / "communication.jsonl") == read_jsonl(ref / "communication.jsonl")
    a, b = load_checkpoint(run)["loop"], load_checkpoint(ref)["loop"]
    assert a["round"] == b["round"] == 5
    assert_same_state(a["clients"], b["clients"])


def test_a_failed_background_write_stops_the_run_with_its_error(fast_args, monkeypatch):
    import fdlit.runs.checkpoint as ckpt

    def disk_full(state, path):
        raise OSError("No space left on device")

    monkeypatch.setattr(ckpt, "save_checkpoint", disk_full)
    parser, cfg = parse_fit(fast_args)
    with pytest.raises(OSError, match="No space left"):
        Experiment(cfg, parser).fit()


# ---------------------------------------------------------------------------------- bad input table
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-round run to copy and damage."""
    parent = tmp_path_factory.mktemp("finished")
    args = ["fit", "--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(parent / "runs"), "--federation.rounds", "2",
            "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
            "--data.num_clients", "3", "--data.classes_per_client", "4", "--data.public_size", "100"]
    assert main(args) == 0
    return only_run(parent / "runs")


def _pickled(run):
    torch.save({"format": "fdlit-checkpoint", "version": 1, "x": RunsCode(run / "code-ran")}, run / CHECKPOINT_NAME)


def _truncated(run):
    data = (run / CHECKPOINT_NAME).read_bytes()
    (run / CHECKPOINT_NAME).write_bytes(data[: len(data) // 3])


def _other_config(run):
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("tau: 0.25", "tau: 0.5"))


def _not_fdlit(run):
    torch.save({"weights": torch.ones(2)}, run / CHECKPOINT_NAME)


# (extra argv, expected error text); RUN stands for a copy of a finished run directory
BAD = [
    (["--data.classes_per_client", "0"], "data.classes_per_client: must be >= 1, got 0"),
    (["--data.classes_per_client", "11"], "data.classes_per_client"),
    (["--aggregator.tau", "-1"], "aggregator.tau: must be a finite number >= 0, got -1.0"),
    (["--data.calibration_fraction", "1.5"], "data.calibration_fraction: must be in (0, 1), got 1.5"),
    (["--data.test_fraction", "1"], "data.test_fraction: must be in (0, 1)"),
    (["--data.dirichlet_alpha", "0"], "data.dirichlet_alpha: must be > 0"),
    (["--data.samples_per_client", "1"], "data.samples_per_client: must be >= 2 or null, got 1"),
    (["--data.public_size", "5000"], "data.public_size: must be <= 1378: the 1438 non-test samples"),
    (["--data.dataset", "nosuch"], "data.dataset: unknown dataset 'nosuch'; allowed: ['cifar10', 'cifar100', 'digits', 'fashion_mnist', 'mnist', 'yahoo_answers']"),
    (["--federation.rounds", "0"], "federation.rounds: must be >= 1, got 0"),
    (["--federation.private_epochs", "-1"], "federation.private_epochs: must be >= 0, got -1"),
    (["--federation.precision", "8-bit"], "federation.precision: allowed: 32-true, bf16-mixed, bf16-true, 16-mixed, 64-true"),
    (["--client.lr", "0"], "client.lr: must be > 0"),
    (["--client.batch_size", "0"], "client.batch_size: must be >= 1"),
    (["--client.optimizer", "lbfgs"], "client.optimizer"),
    (["--logger.mode", "sometimes"], "logger.mode"),
    (["--aggregator.variance_floor", "0"], "aggregator.variance_floor: must be > 0"),
    (["--aggregator.min_calibration_samples", "1"], "aggregator.min_calibration_samples: must be >= 2"),
    (["--model", "fdlit.models.NoSuchNet"], "model"),
    (["--federation.eval_every_n_rounds", "0"], "federation.eval_every_n_rounds: must be >= 1, got 0"),
    (["--federation.eval_subsample", "0"], "federation.eval_subsample: must be >= 1, got 0"),
    (["--checkpoint.every_n_rounds", "0"], "checkpoint.every_n_rounds: must be >= 1, got 0"),
    (["--checkpoint.keep", "-1"], "checkpoint.keep: must be >= 0, got -1"),
    (["--aggregator.density_method", "float16"], "density_method"),
    # resuming
    (["--resume"], "resume: --resume needs a run directory"),
    (["--resume", "/no/such/run"], "resume: no run directory '/no/such/run'"),
    (["--resume", "RUN", "--seed", "3"], "resume: --seed cannot be changed when resuming"),
    (["--resume", "RUN", "--config", "digits.yaml"], "resume: --config cannot be changed when resuming"),
    (["--resume", "RUN", "--federation.rounds", "1"], "resume: checkpoint is at round 2, beyond federation.rounds = 1"),
    (["--resume", "RUN:missing"], "has no checkpoint.pt: no round of that run completed"),
    (["--resume", "RUN:pickled"], "refusing to load"),
    (["--resume", "RUN:truncated"], "is not a readable fdlit checkpoint"),
    (["--resume", "RUN:not_fdlit"], "is not an fdlit checkpoint"),
    (["--resume", "RUN:other_config"], "resume: the checkpoint was written by a different config"),
]
DAMAGE = {"missing": lambda run: (run / CHECKPOINT_NAME).unlink(), "pickled": _pickled, "truncated": _truncated,
          "not_fdlit": _not_fdlit, "other_config": _other_config}


@pytest.mark.parametrize("args,expected", BAD, ids=[" ".join(a)[:40] for a, _ in BAD])
def test_bad_input_is_refused_with_a_clear_error(args, expected, tmp_path, capsys, finished_run):
    assert len(BAD) >= 15
    argv = list(args)
    if "--resume" not in argv:
        argv = ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.run_dir", str(tmp_path / "runs"),
                *argv]
    for i, arg in enumerate(argv):
        if arg.startswith("RUN"):
            run = tmp_path / "run"
            shutil.copytree(finished_run, run)
            if ":" in arg:
                DAMAGE[arg.split(":")[1]](run)
            argv[i] = str(run)
            before = {p.name: p.read_bytes() for p in run.iterdir()}
    try:
        code = main(["fit", *argv])
    except SystemExit as exc:  # jsonargparse's own type errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert not (tmp_path / "runs").exists()  # nothing started
    if (tmp_path / "run").exists():  # a refused resume leaves the run directory as it was
        assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before
        assert not (tmp_path / "run" / "code-ran").exists()


# ---------------------------------------------------------------------------------- tracker faults
class FakeRun:
    id = "fake-run-id"
    dir = "."

    def __init__(self, fail_log):
        self.fail_log = fail_log
        self.logged = []
        self.summary = {}

    def define_metric(self, *a, **k):
        pass

    def log(self, metrics):
        if self.fail_log:
            raise ConnectionError("network unreachable")
        self.logged.append(metrics["round"])

    def finish(self):
        pass


def test_wandb_auth_and_network_failures_never_stop_training(fast_args, tmp_path, capsys, monkeypatch):
    wandb = pytest.importorskip("wandb")
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    calls = []

    def fake_init(**kwargs):
        calls.append(kwargs)
        if kwargs["mode"] == "online":
            raise PermissionError(f"401 unauthorized: api key {secret} rejected")
        return FakeRun(fail_log=True)

    monkeypatch.setattr(wandb, "init", fake_init)
    args = [*fast_args, "--logger.mode", "online", "--federation.rounds", "3"]
    assert main(["fit", *args]) == 0
    err = capsys.readouterr().err
    assert [c["mode"] for c in calls] == ["online", "offline"]
    assert err.count("W&B online init failed") == 1 and "continuing offline" in err
    assert err.count("W&B log failed") == 1  # three failing rounds, said once
    assert secret not in err and "<WANDB_API_KEY>" in err
    run = only_run(tmp_path / "runs")
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    assert json.loads((run / "summary.json").read_text())["finished"]
    state = load_checkpoint(run)
    assert state["wandb_run_id"] == "fake-run-id"
    for path in run.rglob("*"):  # no secret in config, logs or checkpoint
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_resume_continues_the_same_wandb_run(fast_args, tmp_path, capsys, monkeypatch):
    wandb = pytest.importorskip("wandb")
    calls = []

    def fake_init(**kwargs):
        calls.append(kwargs)
        return FakeRun(fail_log=False)

    monkeypatch.setattr(wandb, "init", fake_init)
    assert main(["fit", *fast_args, "--logger.mode", "offline"]) == 0
    run = only_run(tmp_path / "runs")
    assert main(["fit", "--resume", str(run), "--federation.rounds", "3"]) == 0
    assert "id" not in calls[0]
    assert calls[1]["id"] == "fake-run-id" and calls[1]["resume"] == "allow"
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]


def test_wandb_import_or_init_failure_in_offline_mode_keeps_the_run_directory(fast_args, tmp_path, capsys,
                                                                               monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setattr(wandb, "init", lambda **k: (_ for _ in ()).throw(OSError("disk full")))
    assert main(["fit", *fast_args, "--logger.mode", "offline"]) == 0
    err = capsys.readouterr().err
    assert err.count("W&B unavailable (disk full)") == 1
    run = only_run(tmp_path / "runs")
    assert {"config.yaml", "metrics.jsonl", "communication.jsonl", "summary.json", CHECKPOINT_NAME} <= {
        p.name for p in run.iterdir()}


# ---------------------------------------------------------------------------------- determinism, density
def test_same_config_and_seed_identical_metrics_through_the_cli(fast_args, tmp_path):
    for name in ("a", "b"):
        assert main(["fit", *fast_args, "--seed", "11", "--logger.run_dir", str(tmp_path / name)]) == 0
    a, b = (read_jsonl(only_run(tmp_path / n) / "metrics.jsonl") for n in "ab")
    assert strip_timing(a) == strip_timing(b) and len(a) == 2


def test_degenerate_density_fits_follow_the_rule_and_are_counted():
    logits = torch.tensor([[1.0, 2.0], [1.0, 3.0], [5.0, 5.0]])
    labels = torch.tensor([0, 0, 1])
    # class 0: first logit constant (zero variance, floored); class 1: one sample; class 2: no sample
    gmm = DiagonalGaussianMixture.fit(logits, labels, [0, 1, 2], variance_floor=1e-4)
    assert gmm.classes.tolist() == [0] and gmm.dropped == 2 and gmm.floored == 1
    assert gmm.variances[0, 0].item() == pytest.approx(1e-4)
    agg = UncertaintyWeighted()
    uploads = [Message({"logits": logits, "gmm_means": gmm.means.float(), "gmm_stds": gmm.variances.sqrt().float()},
                       metrics={"density/dropped_components": gmm.dropped, "density/floored_variances": gmm.floored})]
    stats = agg.aggregate(uploads, context_for(uploads)).stats
    assert stats["density/dropped_components"] == 2 and stats["density/floored_variances"] == 1


def test_every_torch_load_in_fdlit_is_weights_only():
    """Guards future code: loading a file must never be able to run code."""
    offenders = []
    for path in (REPO / "fdlit").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "torch.load(" in line and "weights_only=True" not in line and not line.lstrip().startswith(("#", "`")):
                offenders.append(f"{path.relative_to(REPO)}:{n}")
            if "pickle.load" in line or "weights_only=False" in line:
                offenders.append(f"{path.relative_to(REPO)}:{n}")
    assert not offenders, offenders


def test_global_random_states_survive_a_weights_only_round_trip(tmp_path):
    import random

    import numpy as np

    from fdlit.runs.checkpoint import rng_state, set_rng_state

    torch.save(rng_state(), tmp_path / "rng.pt")
    def draw():
        return (random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(3).tolist())
    first = draw()
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draw() == first


# ---------------------------------------------------------------------------------- damaged logs
def tiny_args(run_dir, rounds=2):
    return ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(run_dir), "--federation.rounds", str(rounds),
            "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
            "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "100"]


@pytest.fixture(scope="module")
def reference_3_rounds(tmp_path_factory):
    parent = tmp_path_factory.mktemp("reference")
    assert main(["fit", *tiny_args(parent / "runs", rounds=3)]) == 0
    return only_run(parent / "runs")


def _lines(path):
    return path.read_text().splitlines(keepends=True)


DAMAGES = {  # what happens to metrics.jsonl / communication.jsonl of a finished 2-round run
    "garbage-line-in-the-middle": lambda m, c: (m.write_text("{not json\n" + "".join(_lines(m)[1:])),
                                                c.write_text("".join(_lines(c)[:3]) + "\x00\x00\n" + "".join(_lines(c)[3:]))),
    "checkpointed-row-deleted": lambda m, c: (m.write_text("".join(_lines(m)[1:])),
                                              c.write_text("".join(_lines(c)[1:]))),
    "checkpointed-row-altered": lambda m, c: (m.write_text(_lines(m)[0].replace('"round": 1', '"round": 7') + _lines(m)[1]),
                                              None),
    "files-deleted": lambda m, c: (m.unlink(), c.unlink()),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_resume_rebuilds_damaged_logs_from_the_checkpoint_and_keeps_the_damaged_file(damage, tmp_path, capsys,
                                                                                    reference_3_rounds):
    assert main(["fit", *tiny_args(tmp_path / "runs")]) == 0
    run = only_run(tmp_path / "runs")
    metrics, comm = run / "metrics.jsonl", run / "communication.jsonl"
    original = {p.name: p.read_bytes() for p in (metrics, comm)}
    DAMAGES[damage](metrics, comm)
    damaged = {p.name: p.read_bytes() for p in (metrics, comm) if p.exists() and p.read_bytes() != original[p.name]}
    capsys.readouterr()
    assert main(["fit", "--resume", str(run), "--federation.rounds", "3"]) == 0
    err = capsys.readouterr().err
    # every round the checkpoint held is back, and round 3 follows: as in an uninterrupted run
    ref = reference_3_rounds
    assert strip_timing(read_jsonl(metrics)) == strip_timing(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(comm) == read_jsonl(ref / "communication.jsonl")
    copies = {p.name.split(".damaged-")[0]: p.read_bytes() for p in run.glob("*.damaged-*")}
    assert copies == damaged  # each damaged file is kept, byte for byte
    for name in damaged:
        assert f"fdlit: {name} was damaged" in err
    if damage == "files-deleted":
        assert "metrics.jsonl was missing; rebuilt from the checkpoint (2 rows up to round 2)" in err


def test_rows_after_the_checkpoint_and_a_torn_line_are_dropped_without_a_copy(fast_args, tmp_path, capsys):
    assert main(["fit", *fast_args]) == 0
    run = only_run(tmp_path / "runs")
    rows = read_jsonl(run / "metrics.jsonl")
    with open(run / "metrics.jsonl", "a") as f:  # a kill between the metrics and the checkpoint write
        f.write(json.dumps({**rows[-1], "round": 3}) + "\n" + '{"round": 4, "tor')
    assert main(["fit", "--resume", str(run)]) == 0
    assert read_jsonl(run / "metrics.jsonl") == rows
    assert not list(run.glob("*.damaged-*")) and "damaged" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------- one process per run
HOLDER = ("import sys, time\nfrom fdlit.runs.directory import RunLock\nlock = RunLock(sys.argv[1]).acquire()\n"
          "print('held', flush=True)\ntime.sleep(600)\n")


def test_a_second_process_on_a_run_gets_an_error_naming_the_holder_until_it_dies(fast_args, tmp_path, capsys):
    import socket

    assert main(["fit", *fast_args]) == 0
    run = only_run(tmp_path / "runs")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = {p.name: p.read_bytes() for p in run.iterdir()}
        capsys.readouterr()
        assert main(["fit", "--resume", str(run), "--federation.rounds", "3"]) == 2
        err = capsys.readouterr().err
        assert f"fdlit: error: resume: {run} is in use by pid {holder.pid} on host {socket.gethostname()}" in err
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # the holder died without releasing anything: its lock went with it
    assert main(["fit", "--resume", str(run), "--federation.rounds", "3"]) == 0
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]


class TryTheLock(FederationCallback):
    def __init__(self, experiment):
        self.refused, self.experiment = [], experiment

    def on_round_end(self, view, round, metrics):
        from fdlit.runs.directory import RunInUse, RunLock

        try:
            RunLock(Path(self.experiment.run_path)).acquire().release()
        except RunInUse as exc:
            self.refused.append(str(exc))


def test_a_run_holds_its_lock_while_it_runs_and_releases_it_after(fast_args):
    from fdlit.runs.directory import RunLock

    parser, cfg = parse_fit(fast_args)
    experiment = Experiment(cfg, parser)
    probe = TryTheLock(experiment)
    experiment.loop.callbacks.append(probe)
    experiment.fit()
    assert len(probe.refused) == 2 and f"pid {os.getpid()}" in probe.refused[0]
    RunLock(experiment.run_path).acquire().release()  # free once fit returned


def test_a_new_run_never_reuses_an_existing_folder(tmp_path, monkeypatch):
    from datetime import datetime

    import fdlit.runs.directory as directory

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 2, 3, 4, 5, 6)

    monkeypatch.setattr(directory, "datetime", Frozen)
    taken = tmp_path / "20260102-030405-000006-suwa"
    taken.mkdir()
    (taken / "metrics.jsonl").write_text("{}\n")
    made = [directory.create_run_dir(tmp_path, "suwa") for _ in range(2)]
    assert taken not in made and len(set(made)) == 2 and all(not any(p.iterdir()) for p in made)
    assert (taken / "metrics.jsonl").read_text() == "{}\n"


# ---------------------------------------------------------------------------------- stopped by the system or Ctrl-C
class StopInRound2(FederationCallback):
    def on_round_start(self, loop, round):
        if round == 2:
            raise KeyboardInterrupt


def disk_full_on_second_checkpoint(monkeypatch):
    import errno

    real, calls = torch.save, []

    def save(obj, f, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            f.write(b"part of a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device", str(f.name))
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)


def read_only_on_round_2(monkeypatch):
    import errno

    import fdlit.runs.directory as directory

    real = directory.append_jsonl

    def append(path, rows):
        if rows and rows[0].get("round") == 2 and "after_public/global_acc_mean" in rows[0]:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, rows)

    monkeypatch.setattr(directory, "append_jsonl", append)


@pytest.mark.parametrize("how,code,said", [
    ("ctrl-c", 130, "fdlit: interrupted; "),
    ("disk-full", 1, "fdlit: stopped: No space left on device: "),
    ("read-only", 1, "fdlit: stopped: Read-only file system: "),
])
def test_disk_full_read_only_and_ctrl_c_end_with_one_line_and_the_resume_command(how, code, said, fast_args,
                                                                                  tmp_path, capsys, monkeypatch):
    original = Experiment.__init__

    def stopping(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if how == "ctrl-c":
            self.loop.callbacks.append(StopInRound2())

    monkeypatch.setattr(Experiment, "__init__", stopping)
    {"disk-full": disk_full_on_second_checkpoint, "read-only": read_only_on_round_2}.get(how, lambda m: None)(monkeypatch)
    assert main(["fit", *fast_args]) == code
    run = only_run(tmp_path / "runs")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines  # no traceback
    assert lines[0].startswith(said)
    assert lines[0].endswith(f"run directory {run}: the checkpoint of round 1 is intact; continue with: "
                             f"python -m fdlit fit --resume {run}")
    assert not list(run.glob("*.tmp"))  # a failed write leaves no half file
    monkeypatch.undo()
    assert main(["fit", "--resume", str(run)]) == 0  # and the lock went with the stopped run
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]


def test_sigint_of_a_real_process_ends_with_one_line_and_exit_130(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    args = tiny_args(tmp_path / "runs", rounds=50)
    # a suite started in the background (`make test &`) hands its children SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler: give the child the default disposition
    proc = subprocess.Popen([sys.executable, "-m", "fdlit", "fit", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not list((tmp_path / "runs").glob("*/checkpoint.pt")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    run = only_run(tmp_path / "runs")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fdlit: interrupted; run directory") and last.endswith(f"fit --resume {run}")


def test_a_run_saved_under_an_unsafe_name_still_resumes(fast_args, tmp_path, capsys):
    assert main(["fit", *fast_args]) == 0
    run = only_run(tmp_path / "runs")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("name: null", "name: team/run 1"))
    assert main(["fit", "--resume", str(run), "--federation.rounds", "3"]) == 0
    assert "fdlit: the run's name 'team/run 1' is not one folder name; it continues as 'team_run_1'" in \
        capsys.readouterr().err
    assert "name: team_run_1" in config.read_text()
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
