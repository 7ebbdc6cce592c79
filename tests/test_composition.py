"""The composition matrix: every shipped rule x {sequential, vectorized, Ray} x {fd, local_only},
and every rule stopped after round 1 and resumed. Methods reach the loop only through their client
and server parts, so each combination must run, count its bytes once, and resume exactly."""

import json
from pathlib import Path

import pytest
import torch

from fdlit.cli import main
from fdlit.config import parse_fit
from fdlit.runs import read_jsonl
from fdlit.runs.experiment import Experiment

RULES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "configs").glob("digits*.yaml"))
EXECUTORS = {
    "sequential": "fdlit.execution.SequentialExecutor",
    "vectorized": "fdlit.execution.VectorizedExecutor",
    "ray": "fdlit.execution.RayExecutor",
}
# rules whose set-up sends messages (round 0): the cases where modes and resume went wrong
SETUP_RULES = ("digits_meta_model.yaml", "digits_fedgo.yaml", "digits_lkd_server.yaml")


def tiny(config, tmp_path, *extra, rounds=2):
    return ["--config", config, "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", str(rounds),
            "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
            "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "120",
            "--model", "fdlit.models.MLP", "--model.hidden", "[16]", *extra]


def fit_loop(argv):
    parser, cfg = parse_fit(argv)
    loop = Experiment(cfg, parser).loop
    loop.fit()
    return loop


def test_the_matrix_covers_every_shipped_rule():
    assert len(RULES) >= 13 and "digits.yaml" in RULES and "digits_selective_fd.yaml" in RULES


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("mode", ["fd", "local_only"])
@pytest.mark.parametrize("rule", RULES)
def test_rule_x_executor_x_mode(rule, executor, mode, tmp_path):
    loop = fit_loop(tiny(rule, tmp_path, "--federation.executor", EXECUTORS[executor], "--federation.mode", mode))
    assert loop.round == 2 and len(loop.history) == 2
    if mode == "local_only":  # promises no communication: nothing at all, set-up included
        assert loop.server_side.ledger.messages == [] and loop.history[-1]["comm/up_bytes_total"] == 0
    else:
        assert {m.round for m in loop.server_side.ledger.messages} >= {1, 2}
        assert loop.server_side.ledger.total("up") == loop.history[-1]["comm/up_bytes_total"] > 0


@pytest.mark.parametrize("rule", SETUP_RULES)
def test_reference_mode_sends_nothing(rule, tmp_path):
    loop = fit_loop(tiny(rule, tmp_path, "--federation.mode", "reference"))
    assert loop.server_side.ledger.messages == [] and len(loop.view.clients) == 1


def ledger_rows(loop):
    return [(m.round, m.client, m.direction, m.kind, m.shape, m.bytes) for m in loop.server_side.ledger.messages]


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_runs_under_ray_and_sends_what_it_sends_in_process(rule, tmp_path, ray_local):
    """Ray actors run the client parts (set-up included); the bytes equal the in-process run's."""
    ray_loop = fit_loop(tiny(rule, tmp_path / "ray", "--federation.executor", EXECUTORS["ray"],
                             "--federation.executor.actor_executor", "sequential"))
    seq_loop = fit_loop(tiny(rule, tmp_path / "seq", "--federation.executor", EXECUTORS["sequential"]))
    assert ray_loop.round == 2
    assert ledger_rows(ray_loop) == ledger_rows(seq_loop)


@pytest.mark.parametrize("rule", SETUP_RULES)
def test_local_only_under_ray_sends_nothing(rule, tmp_path, ray_local):
    loop = fit_loop(tiny(rule, tmp_path, "--federation.executor", EXECUTORS["ray"], "--federation.mode", "local_only"))
    assert loop.round == 2 and loop.server_side.ledger.messages == []


def without_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def only_run(parent: Path) -> Path:
    (run,) = [p for p in parent.iterdir() if p.is_dir()]
    return run


@pytest.mark.parametrize("rule", RULES)
def test_stopped_after_round_1_and_resumed_equals_an_uninterrupted_run(rule, tmp_path):
    assert main(["fit", *tiny(rule, tmp_path / "straight")]) == 0
    assert main(["fit", *tiny(rule, tmp_path / "stopped", "--federation.rounds", "1")]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "2"]) == 0
    straight = only_run(tmp_path / "straight")
    assert read_jsonl(stopped / "communication.jsonl") == read_jsonl(straight / "communication.jsonl")
    assert without_time(read_jsonl(stopped / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["finished"] and summary["bytes_up_total"] == json.loads(
        (straight / "summary.json").read_text())["bytes_up_total"]


# ---------------------------------------------------------------- participation
PARTIAL = ("--federation.participation.fraction", "0.5", "--federation.participation.dropout", "0.3",
           "--federation.participation.public_fraction", "0.5")


def round_clients(loop, direction):
    """Per round >= 1, the clients the ledger has messages of in ``direction``."""
    out: dict[int, set] = {}
    for m in loop.server_side.ledger.messages:
        if m.round >= 1 and m.direction == direction:
            out.setdefault(m.round, set()).add(m.client)
    return out


@pytest.mark.parametrize("executor", ["sequential", "vectorized", "ray"])
@pytest.mark.parametrize("rule", ["digits.yaml", "digits_meta_model.yaml"])
def test_participation_and_dropout_under_every_executor(rule, executor, tmp_path, request):
    """Half the clients sampled, some dropped: only arrived clients send and receive, on N' = N/2
    public rows; the unsampled ones keep their state; every executor sends the same messages."""
    extra = ["--federation.executor", EXECUTORS[executor]]
    if executor == "ray":
        request.getfixturevalue("ray_local")
        extra += ["--federation.executor.actor_executor", "sequential"]
    loop = fit_loop(tiny(rule, tmp_path, *extra, *PARTIAL))
    assert loop.round == 2
    up, down = round_clients(loop, "up"), round_clients(loop, "down")
    for m in loop.history:
        sampled, arrived = m["participation/clients"], m["participation/arrived"]
        assert len(sampled) == 2 and set(arrived) <= set(sampled)
        assert up.get(m["round"], set()) == down.get(m["round"], set()) == set(arrived)
        assert m["participation/public_size"] == 60
        assert len(m["clients/after_public/global_acc"]) == 4  # evaluation still measures every client
    logits = [r for r in loop.server_side.ledger.messages if r.kind == "logits" and r.round >= 1]
    assert logits and all(r.shape[0] == 60 for r in logits)  # only this round's public rows travel
    if executor != "sequential":
        seq = fit_loop(tiny(rule, tmp_path / "seq", "--federation.executor", EXECUTORS["sequential"], *PARTIAL))
        assert ledger_rows(loop) == ledger_rows(seq)
        assert [m["participation/arrived"] for m in loop.history] == [m["participation/arrived"] for m in seq.history]


@pytest.mark.parametrize("rule", ["digits.yaml", "digits_meta_model.yaml"])
def test_participation_stopped_after_round_1_and_resumed_equals_an_uninterrupted_run(rule, tmp_path):
    """The draws depend on (seed, round) only: a resumed run samples, drops and subsets alike."""
    assert main(["fit", *tiny(rule, tmp_path / "straight", *PARTIAL)]) == 0
    assert main(["fit", *tiny(rule, tmp_path / "stopped", *PARTIAL, "--federation.rounds", "1")]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "2"]) == 0
    straight = only_run(tmp_path / "straight")
    assert read_jsonl(stopped / "communication.jsonl") == read_jsonl(straight / "communication.jsonl")
    resumed, uninterrupted = (without_time(read_jsonl(p / "metrics.jsonl")) for p in (stopped, straight))
    assert resumed == uninterrupted
    assert [m["participation/clients"] for m in resumed] == [m["participation/clients"] for m in uninterrupted]
    assert resumed[0]["participation/clients"] != resumed[1]["participation/clients"] or \
        resumed[0]["participation/arrived"] != resumed[1]["participation/arrived"]  # the draw changes by round


SAMPLED = ("--data.num_clients", "6", "--federation.participation.fraction", "0.5",
           "--federation.participation.dropout", "0.2")
DP = ("--privacy.noise_multiplier", "1.0", "--privacy.clip_norm", "5.0")


@pytest.mark.parametrize("rule", RULES)
def test_every_method_under_client_sampling_dropout_and_a_public_subset(rule, tmp_path):
    """Every shipped method with half the clients sampled, a fifth of those dropped and half the
    public rows per round: the round's uploads come from a subset, so a server part that indexes
    per-client state by position (FedDF's n_k, FedGO's discriminator scores) must use the round's
    client ids, and a client part that keeps state over the public set (Selective-FD's masks) must
    use the round's rows."""
    loop = fit_loop(tiny(rule, tmp_path, *SAMPLED, "--federation.participation.public_fraction", "0.5"))
    assert loop.round == 2
    for m in loop.history:
        assert len(m["participation/clients"]) == 3 and set(m["participation/arrived"]) <= set(m["participation/clients"])
        assert m["participation/public_size"] == 60
    up = round_clients(loop, "up")
    assert all(up.get(m["round"], set()) == set(m["participation/arrived"]) for m in loop.history)
    rows = [r for r in loop.server_side.ledger.messages
            if r.round >= 1 and r.direction == "up" and r.kind in ("logits", "mask")]
    assert all(r.shape[0] <= 60 for r in rows)  # nothing beyond this round's public rows goes up


@pytest.mark.parametrize("rule", RULES)
def test_every_method_sampled_with_dp_stopped_and_resumed_equals_an_uninterrupted_run(rule, tmp_path, capsys):
    """The other axes together, for every method: client sampling with dropout, DP on the uploads
    where the method allows it (refused with one line naming the privacy field, before any round,
    where it does not), and a stop after round 1 with a resume."""
    code = main(["fit", *tiny(rule, tmp_path / "straight", *SAMPLED, *DP)])
    err = capsys.readouterr().err
    if code != 0:  # refused: a ConfigError naming the privacy section, nothing trained
        assert code == 2 and err.startswith("fdlit: error: privacy.") and "Traceback" not in err
        assert not [p for p in (tmp_path / "straight").rglob("metrics.jsonl") if p.read_text().strip()]
        return
    resumed, ledger = stopped_and_resumed_equals_straight(rule, tmp_path, *SAMPLED, *DP)
    assert all(m["privacy/epsilon"] > 0 for m in resumed)


def stopped_and_resumed_equals_straight(rule, tmp_path, *flags) -> tuple[list, list]:
    """Run ``rule`` with ``flags`` stopped after round 1 and resumed to round 2 next to the run already made
    in ``tmp_path/straight``; assert metrics (timings aside) and ledger equal; return them."""
    assert main(["fit", *tiny(rule, tmp_path / "stopped", *flags, "--federation.rounds", "1")]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "2"]) == 0
    straight = only_run(tmp_path / "straight")
    resumed, uninterrupted = (without_time(read_jsonl(p / "metrics.jsonl")) for p in (stopped, straight))
    assert resumed == uninterrupted and len(resumed) == 2
    ledger = read_jsonl(straight / "communication.jsonl")
    assert ledger == read_jsonl(stopped / "communication.jsonl")
    return resumed, ledger


# ---------------------------------------------------------------- adversarial clients
ATTACKS = {  # attack: (a rule it fits, its flags); client 1 attacks (client 2 too where they collude)
    "label_flipping": ("digits.yaml", ["--adversaries.attack", "fdlit.adversaries.LabelFlipping"]),
    "targeted_label_flipping": ("digits_fedavg.yaml", ["--adversaries.attack", "fdlit.adversaries.LabelFlipping",
                                                       "--adversaries.attack.source", "[0, 1, 3, 4, 5, 6, 7, 8, 9]",
                                                       "--adversaries.attack.target", "2"]),
    "random_predictions": ("digits_avg.yaml", ["--adversaries.attack", "fdlit.adversaries.RandomPredictions"]),
    "uniform_predictions": ("digits_median.yaml", ["--adversaries.attack", "fdlit.adversaries.RandomPredictions",
                                                   "--adversaries.attack.kind", "uniform"]),
    "confident_wrong": ("digits_avg.yaml", ["--adversaries.attack", "fdlit.adversaries.ConfidentWrong"]),
    "scaled_logits": ("digits_era.yaml", ["--adversaries.attack", "fdlit.adversaries.ScaledLogits"]),
    "free_rider": ("digits_avg.yaml", ["--adversaries.attack", "fdlit.adversaries.FreeRider"]),
    "free_rider_parameters": ("digits_fedavg.yaml", ["--adversaries.attack", "fdlit.adversaries.FreeRider"]),
    "fabricated_density": ("digits_uwa.yaml", ["--adversaries.attack", "fdlit.adversaries.FabricatedDensity"]),
    "sign_flipped_update": ("digits_krum.yaml", ["--adversaries.attack", "fdlit.adversaries.SignFlippedUpdate"]),
    "scaled_update": ("digits_fedtrimmedmean.yaml", ["--adversaries.attack", "fdlit.adversaries.ScaledUpdate",
                                                     "--adversaries.attack.scale", "10"]),
    "colluding": ("digits.yaml", ["--adversaries.attack", "fdlit.adversaries.FabricatedDensity",
                                  "--adversaries.ids", "[1, 2]", "--adversaries.collude", "true"]),
}
_honest_runs: dict = {}


def honest_run(rule, executor, tmp_path):
    """The run without attackers (one per rule and executor for the whole matrix)."""
    if (rule, executor) not in _honest_runs:
        _honest_runs[rule, executor] = fit_loop(tiny(rule, tmp_path / "honest", *executor_flags(executor)))
    return _honest_runs[rule, executor]


def executor_flags(executor):
    extra = ["--federation.executor", EXECUTORS[executor]]
    return extra + (["--federation.executor.actor_executor", "sequential"] if executor == "ray" else [])


def outcome(loop):
    """Every client's final parameters (an attack reaches them through the teacher, the global model or
    the attacker's own training)."""
    return torch.cat([p.detach().reshape(-1) for c in loop.view.clients for p in c.model.parameters()])


@pytest.mark.parametrize("executor", ["sequential", "vectorized", "ray"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_attack_x_executor(attack, executor, tmp_path, request):
    """Each attack runs where the clients live: it changes the clients' models against the honest run
    under the same executor, sends the same messages (the fabricated density: one component per public
    row, so its shapes differ), and logs its metrics."""
    if executor == "ray":
        request.getfixturevalue("ray_local")
    rule, flags = ATTACKS[attack]
    who = [] if "--adversaries.ids" in flags else ["--adversaries.ids", "[1]"]
    loop = fit_loop(tiny(rule, tmp_path / "attacked", *executor_flags(executor), *flags, *who))
    honest = honest_run(rule, executor, tmp_path)
    sent, honest_sent = ledger_rows(loop), ledger_rows(honest)
    if flags[1].endswith("FabricatedDensity"):
        sent, honest_sent = [r[:4] for r in sent], [r[:4] for r in honest_sent]
    assert loop.round == 2 and sent == honest_sent
    assert not torch.equal(outcome(loop), outcome(honest))
    last = loop.history[-1]
    assert last["adversaries/attackers"] == (2 if attack == "colluding" else 1)
    assert len([k for k in last if k.startswith("adversaries/honest_")]) == 2
    if attack in ("fabricated_density", "colluding"):  # the fabricated density takes the teacher
        assert last["adversaries/weight"] > 0.9


# ---------------------------------------------------------------- secure aggregation and the upload audit
SECURE = ("--privacy.secure_aggregation", "true", "--privacy.upload_audit", "true")


@pytest.mark.parametrize("rule", RULES)
def test_every_method_under_secure_aggregation_runs_and_resumes_or_is_refused_in_one_line(rule, tmp_path, capsys):
    """Every shipped method with masked uploads (and the upload audit on), clients sampled with dropout:
    a rule computed from sums runs, sends the protocol's messages and resumes exactly; any other is
    refused before any round in one line naming the setting."""
    code = main(["fit", *tiny(rule, tmp_path / "straight", *SAMPLED, *SECURE)])
    err = capsys.readouterr().err
    if code != 0:
        assert code == 2 and err.startswith("fdlit: error: ") and "Traceback" not in err and len(err.splitlines()) == 1
        assert not [p for p in (tmp_path / "straight").rglob("metrics.jsonl") if p.read_text().strip()]
        return
    _, ledger = stopped_and_resumed_equals_straight(rule, tmp_path, *SAMPLED, *SECURE)
    assert any(str(row.get("kind", "")).startswith("secagg") for row in ledger)  # the protocol ran
