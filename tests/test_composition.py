"""The composition matrix: every shipped rule under executors, modes, client sampling, DP, secure
aggregation and a stop-and-resume. Methods reach the loop only through their client and server parts, so
each combination must run, count its bytes once and resume exactly, or be refused in one line.

The full product is ~1,400 runs; the matrix is a covering array instead: every pair of dimension values
(every method under every executor, privacy setting, participation, mode and resume; every executor
with every privacy setting; ...) in at least one cell, built greedily and deterministically below. The
costly checks go where bugs lived: a Ray cell also runs in-process and compares every message; a
vectorized cell with client sampling does too (stacked clients indexed by the round's subset)."""

import itertools

import pytest
import torch

from fdlit.cli import main
from fdlit.runs import read_jsonl
from tests.fitting import (
    EXECUTORS,
    RULES,
    executor_flags,
    fit_loop,
    ledger_rows,
    only_run,
    stopped_and_resumed_equals_straight,
    tiny,
)

# rules whose set-up sends messages (round 0): the cases where modes and resume went wrong
SETUP_RULES = ("digits_meta_model.yaml", "digits_fedgo.yaml", "digits_lkd_server.yaml")
DIMENSIONS = {  # the first value of each is the cheap one, taken where a cell's pairs leave it free
    "rule": RULES,
    "executor": ["sequential", "vectorized", "ray"],
    "privacy": ["none", "dp", "secure"],
    "mode": ["fd", "local_only"],
    "participation": ["full", "sampled"],
    "resume": ["straight", "resumed"],
}
FLAGS = {
    ("privacy", "dp"): ("--privacy.noise_multiplier", "1.0", "--privacy.clip_norm", "5.0"),
    ("privacy", "secure"): ("--privacy.secure_aggregation", "true", "--privacy.upload_audit", "true"),
    ("mode", "local_only"): ("--federation.mode", "local_only"),
    # 6 clients, half sampled, a fifth of those dropped, half the public rows per round
    ("participation", "sampled"): ("--data.num_clients", "6", "--federation.participation.fraction", "0.5",
                                   "--federation.participation.dropout", "0.2",
                                   "--federation.participation.public_fraction", "0.5"),
}
# cells the risk puts in first: set-up messages under Ray with nothing to send, and client sampling
# with every executor and with a resume, for the rule whose set-up sends messages and for the default
SEED_CELLS = [
    *({"rule": r, "executor": "ray", "mode": "local_only"} for r in SETUP_RULES),
    *({"rule": r, "executor": e, "participation": "sampled"}
      for r in ("digits.yaml", "digits_meta_model.yaml") for e in ("vectorized", "ray")),
    *({"rule": r, "participation": "sampled", "resume": "resumed"} for r in ("digits.yaml", "digits_meta_model.yaml")),
]


def allowed(cell: dict) -> bool:
    """local_only promises no communication: nothing to sample, noise or mask."""
    return cell.get("mode") != "local_only" or (cell.get("privacy", "none") == "none"
                                                and cell.get("participation", "full") == "full")


def pairs_of(cell: dict) -> set:
    return {((a, cell[a]), (b, cell[b])) for a, b in itertools.combinations(DIMENSIONS, 2) if a in cell and b in cell}


def completed(cell: dict, dimensions: dict, uncovered: set) -> dict:
    """``cell`` with its free dimensions filled in order, each with the allowed value covering most
    uncovered pairs (ties to the first listed: the cheap value)."""
    cell = dict(cell)
    for name, values in dimensions.items():
        if name not in cell:
            options = [v for v in values if allowed({**cell, name: v})]
            cell[name] = max(options, key=lambda v, n=name: (len(pairs_of({**cell, n: v}) & uncovered),
                                                              -values.index(v)))
    return cell


def covering_array(dimensions: dict, seeds: list[dict]) -> list[dict]:
    """Cells (one value per dimension) holding every allowed pair of values at least once: the seed cells
    completed, then greedily the cell, among those started from each uncovered pair, that covers the most
    uncovered pairs (AETG's greedy step; ties to the earliest pair). Deterministic: no randomness."""
    names = list(dimensions)
    uncovered = {p for a, b in itertools.combinations(names, 2) for va in dimensions[a] for vb in dimensions[b]
                 if allowed({a: va, b: vb}) for p in [((a, va), (b, vb))]}
    order = [((a, va), (b, vb)) for a, b in itertools.combinations(names, 2) for va in dimensions[a]
             for vb in dimensions[b]]
    cells = []
    for seed in seeds:
        cells.append(completed(seed, dimensions, uncovered))
        uncovered -= pairs_of(cells[-1])
    while uncovered:
        starts = (completed(dict(p), dimensions, uncovered) for p in order if p in uncovered)
        best = max(starts, key=lambda c: len(pairs_of(c) & uncovered))  # max keeps the first of equals
        cells.append(best)
        uncovered -= pairs_of(best)
    return cells


CELLS = covering_array(DIMENSIONS, SEED_CELLS)


def cell_id(cell: dict) -> str:
    return "-".join([cell["rule"].removesuffix(".yaml"), *(cell[k] for k in DIMENSIONS if k != "rule")])


def test_the_matrix_covers_every_shipped_rule_and_every_allowed_pair():
    assert len(RULES) >= 13 and "digits.yaml" in RULES and "digits_selective_fd.yaml" in RULES
    covered = set().union(*map(pairs_of, CELLS))
    for a, b in itertools.combinations(DIMENSIONS, 2):
        for va, vb in itertools.product(DIMENSIONS[a], DIMENSIONS[b]):
            assert (((a, va), (b, vb)) in covered) == allowed({a: va, b: vb}), (a, va, b, vb)
    assert all(allowed(c) for c in CELLS) and covering_array(DIMENSIONS, SEED_CELLS) == CELLS  # deterministic
    assert len(CELLS) <= 4 * len(RULES)  # the least possible is 3 x rules (rule x executor); the product ~36 x


def flags_of(cell: dict) -> list[str]:
    flags = [f for (name, value), fs in FLAGS.items() if cell[name] == value for f in fs]
    if cell["executor"] == "ray" and cell["participation"] == "full":
        # one actor holds the four clients (a Ray run's cost is mostly its actors' start); the sampled
        # cells keep two, so a round's subset and the secure-sum protocol still cross actors
        flags += ["--federation.executor.clients_per_actor", "4"]
    return [*executor_flags(cell["executor"]), *flags]


def rows_of(ledger: list[dict]) -> list[tuple]:
    return [(r["round"], r["client"], r["direction"], r["kind"], r["shape"], r["bytes"]) for r in ledger]


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_cell(cell, tmp_path, request, capsys):
    """Each cell runs two rounds or is refused before any round in one line naming the setting (DP or secure
    aggregation where the method cannot take it); a run counts its bytes once, sends nothing in local_only,
    only from the round's arrived clients on the round's public rows when sampled, spends epsilon under DP,
    runs the secure-sum protocol under secure aggregation, and resumed after round 1 equals itself."""
    if cell["executor"] == "ray":
        request.getfixturevalue("ray_local")
        capsys.readouterr()  # what Ray prints as it starts (in the module's first Ray cell) is not the run's
    rule, flags = cell["rule"], flags_of(cell)
    code = main(["fit", *tiny(rule, tmp_path / "straight", *flags)])
    err = capsys.readouterr().err
    if code != 0:  # refused: only a privacy setting may be, in one line naming it, with nothing trained
        assert cell["privacy"] != "none" and code == 2, err[-3000:]
        field = "privacy." if cell["privacy"] == "dp" else ""
        assert err.startswith(f"fdlit: error: {field}") and len(err.splitlines()) == 1 and "Traceback" not in err
        assert not [p for p in (tmp_path / "straight").rglob("metrics.jsonl") if p.read_text().strip()]
        return
    run = only_run(tmp_path / "straight")
    history, ledger = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "communication.jsonl")
    assert [m["round"] for m in history] == [1, 2]
    if cell["mode"] == "local_only":  # promises no communication: nothing at all, set-up included
        assert ledger == [] and history[-1]["comm/up_bytes_total"] == 0
    else:
        assert {r["round"] for r in ledger} >= {1, 2}
        assert sum(r["bytes"] for r in ledger if r["direction"] == "up") == history[-1]["comm/up_bytes_total"] > 0
    if cell["participation"] == "sampled":
        for m in history:
            sampled, arrived = m["participation/clients"], m["participation/arrived"]
            assert len(sampled) == 3 and set(arrived) <= set(sampled) and m["participation/public_size"] == 60
            up = [r for r in ledger if r["round"] == m["round"] and r["direction"] == "up"]
            assert {r["client"] for r in up} <= set(sampled)
            # only arrived clients send an upload; under secure aggregation every sampled client takes part
            # in the key exchange first (a client that drops after it is what the shares recover from)
            uploads = {r["client"] for r in up if r["kind"] not in ("secagg_keys", "secagg_shares")}
            assert uploads == set(arrived)
            assert len(m["clients/after_public/global_acc"]) == 6  # evaluation still measures every client
        assert history[0]["participation/clients"] != history[1]["participation/clients"]  # drawn per round
        assert all(r["shape"][0] <= 60 for r in ledger if r["round"] >= 1 and r["direction"] == "up"
                   and r["kind"] in ("logits", "mask"))  # nothing beyond this round's public rows goes up
    if cell["privacy"] == "dp":
        assert all(m["privacy/epsilon"] > 0 for m in history)
    if cell["privacy"] == "secure":
        assert any(str(r["kind"]).startswith("secagg") for r in ledger)  # the protocol ran
    if cell["executor"] == "ray" or (cell["executor"] == "vectorized" and cell["participation"] == "sampled"):
        seq = dict(cell, executor="sequential")  # the same messages, run in this process one client at a time
        assert main(["fit", *tiny(rule, tmp_path / "sequential", *flags_of(seq))]) == 0
        in_process = only_run(tmp_path / "sequential")
        assert rows_of(ledger) == rows_of(read_jsonl(in_process / "communication.jsonl"))
        if cell["participation"] == "sampled":
            assert [m["participation/arrived"] for m in history] == \
                [m["participation/arrived"] for m in read_jsonl(in_process / "metrics.jsonl")]
    if cell["resume"] == "resumed":
        stopped_and_resumed_equals_straight(rule, tmp_path, *flags)


@pytest.mark.parametrize("rule", SETUP_RULES)
def test_reference_mode_sends_nothing(rule, tmp_path):
    loop = fit_loop(tiny(rule, tmp_path, "--federation.mode", "reference"))
    assert loop.server_side.ledger.messages == [] and len(loop.view.clients) == 1


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
# every attack under one executor, chosen so that each executor runs attacks on predictions and on
# parameters; the two whose state spans clients or whose shapes differ (collusion, the fabricated
# density) under every executor: Ray's actors hold clients in other processes
ONE_EXECUTOR = {"label_flipping": "sequential", "uniform_predictions": "sequential", "free_rider": "sequential",
                "targeted_label_flipping": "vectorized", "confident_wrong": "vectorized", "scaled_logits": "vectorized",
                "sign_flipped_update": "vectorized", "random_predictions": "ray", "free_rider_parameters": "ray",
                "scaled_update": "ray"}
ATTACK_CELLS = sorted({*ONE_EXECUTOR.items(), *((a, e) for a in ("colluding", "fabricated_density") for e in EXECUTORS)})
_honest_runs: dict = {}


def honest_run(rule, executor, tmp_path, *layout):
    """The run without attackers (one per rule, executor and actor layout for the whole matrix)."""
    if (rule, executor, layout) not in _honest_runs:
        _honest_runs[rule, executor, layout] = fit_loop(tiny(rule, tmp_path / "honest", *executor_flags(executor),
                                                             *layout))
    return _honest_runs[rule, executor, layout]


def outcome(loop):
    """Every client's final parameters (an attack reaches them through the teacher, the global model or
    the attacker's own training)."""
    return torch.cat([p.detach().reshape(-1) for c in loop.view.clients for p in c.model.parameters()])


def test_every_attack_and_every_executor_are_in_the_attack_matrix():
    assert {a for a, _ in ATTACK_CELLS} == set(ATTACKS) and {e for _, e in ATTACK_CELLS} == set(EXECUTORS)


@pytest.mark.parametrize(("attack", "executor"), ATTACK_CELLS)
def test_attack_under_executor(attack, executor, tmp_path, request):
    """Each attack runs where the clients live: it changes the clients' models against the honest run
    under the same executor, sends the same messages (the fabricated density: one component per public
    row, so its shapes differ), and logs its metrics."""
    if executor == "ray":
        request.getfixturevalue("ray_local")
    rule, flags = ATTACKS[attack]
    who = [] if "--adversaries.ids" in flags else ["--adversaries.ids", "[1]"]
    # one actor holds the four clients (its start is most of a Ray run's cost), but for the two attacks
    # whose state spans clients: their attackers sit on two actors
    layout = (("--federation.executor.clients_per_actor", "4")
              if executor == "ray" and attack not in ("colluding", "fabricated_density") else ())
    loop = fit_loop(tiny(rule, tmp_path / "attacked", *executor_flags(executor), *flags, *who, *layout))
    honest = honest_run(rule, executor, tmp_path, *layout)
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
