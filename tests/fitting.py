"""Shared helpers for tests that fit tiny federations (not a test module: tests import these instead of
importing each other). Fixtures live in conftest.py."""

import json
import signal
import time
from pathlib import Path

import torch

from fdlit.cli import main
from fdlit.clients import ClientOptimization
from fdlit.configuration.schema import parse_fit
from fdlit.data import FederatedData
from fdlit.execution import SequentialExecutor
from fdlit.federation import FederationLoop
from fdlit.messages import Upload
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart
from fdlit.methods.parameters import exchanged_tensors, flatten
from fdlit.models.mutual import find_pair
from fdlit.runs import read_jsonl
from fdlit.runs.experiment import Experiment

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MLP16 = {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}}
RULES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "configs").glob("digits*.yaml"))
EXECUTORS = {
    "sequential": "fdlit.execution.SequentialExecutor",
    "vectorized": "fdlit.execution.VectorizedExecutor",
    "ray": "fdlit.execution.RayExecutor",
}


def tiny(config, tmp_path, *extra, rounds=2):
    """``fit`` arguments for a two-round, four-client MLP federation of ``config`` writing into ``tmp_path``."""
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


def executor_flags(executor):
    extra = ["--federation.executor", EXECUTORS[executor]]
    return extra + (["--federation.executor.actor_executor", "sequential"] if executor == "ray" else [])


def ledger_rows(loop):
    return [(m.round, m.client, m.direction, m.kind, m.shape, m.bytes) for m in loop.server_side.ledger.messages]


def without_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def only_run(parent: Path) -> Path:
    (run,) = [p for p in parent.iterdir() if p.is_dir()]
    return run


def stopped_and_resumed_equals_straight(rule, tmp_path, *flags) -> tuple[list, list]:
    """Run ``rule`` with ``flags`` stopped after round 1 and resumed to round 2 next to the run already made
    in ``tmp_path/straight``; assert metrics (timings aside), ledger and summary bytes equal; return them."""
    assert main(["fit", *tiny(rule, tmp_path / "stopped", *flags, "--federation.rounds", "1")]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "2"]) == 0
    straight = only_run(tmp_path / "straight")
    resumed, uninterrupted = (without_time(read_jsonl(p / "metrics.jsonl")) for p in (stopped, straight))
    assert resumed == uninterrupted and len(resumed) == 2
    ledger = read_jsonl(straight / "communication.jsonl")
    assert ledger == read_jsonl(stopped / "communication.jsonl")
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["finished"] and summary["bytes_up_total"] == json.loads(
        (straight / "summary.json").read_text())["bytes_up_total"]
    return resumed, ledger


# ---------------------------------------------------------------- loops built directly, and a method by class path
def exchange_loop(method, rounds=2, clients=4, optimizer="sgd", lr=0.05, batch_size=32, executor=None, epochs=1,
                  **kw):
    """A parameter-exchange federation of ``clients`` digits clients with a 120-row public set."""
    return FederationLoop(
        rounds=rounds, private_epochs_first=epochs, private_epochs=epochs, public_epochs_first=1, public_epochs=1,
        data=FederatedData(num_clients=clients, classes_per_client={1: 10, 2: 5}.get(clients, 3), public_size=120),
        model=MLP16, client=ClientOptimization(optimizer=optimizer, lr=lr, batch_size=batch_size),
        aggregator=method, executor=executor or SequentialExecutor(), **kw,
    )


def data_free_loop(method, rounds=2, clients=4, model=MLP16, executor=None, optimizer="adam", **kw):
    """A data-free federation (no public set) of ``clients`` digits clients, one private epoch a round."""
    return FederationLoop(
        rounds=rounds, private_epochs_first=1, private_epochs=1, public_epochs_first=0, public_epochs=0,
        data=FederatedData(num_clients=clients, classes_per_client={1: 10}.get(clients, 3), public_size=0),
        model=model, client=ClientOptimization(optimizer=optimizer, lr=0.01, batch_size=32),
        aggregator=method, executor=executor or SequentialExecutor(), **kw,
    )


def one_round_args(tmp_path, *extra):
    """``fit`` arguments for one round of four digits clients with six classes each, an MLP with 16 units."""
    return ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", "1", "--federation.private_epochs_first", "1",
            "--federation.public_epochs_first", "1", "--data.num_clients", "4", "--data.classes_per_client", "6",
            "--data.public_size", "100", "--model.hidden", "[16]", *extra]


class GatedVotesClient(ClientPart):
    """docs/extending.md's gated votes: a client sends its probabilities on the rows it is confident
    about and the mask of those rows, never its logits."""

    uploads = (Upload("probs", "rows", shape=(None, "C")), Upload("mask", "clear", dtype=torch.bool, shape=("N",)))

    def upload(self, ctx):
        probs = ctx.public_logits.float().softmax(-1)
        confidence = probs.max(-1).values
        mask = confidence >= confidence.median()  # the more confident half
        return {"probs": probs[mask], "mask": mask}


class GatedVotes(Aggregator):
    short_name = "gated_votes"

    def __init__(self):
        self.received: list[dict[str, tuple]] = []

    def client_part(self):
        return GatedVotesClient()

    def aggregate(self, uploads, ctx):
        self.received += [{k: tuple(v.shape) for k, v in u.items()} for u in uploads]
        n, c = len(ctx.info.public_x), ctx.info.num_classes
        votes = torch.zeros(n, c)
        for u in uploads:
            votes[u["mask"].cpu()] += u["probs"].float().cpu()
        votes = votes.clamp(min=0)  # DP noise pushes some noised probabilities below 0: no negative vote
        keep = votes.sum(-1) > 0
        teacher = torch.where(keep[:, None], votes, torch.ones(n, c))
        return AggregationResult(teacher=teacher / teacher.sum(-1, keepdim=True), keep=keep)


def loop_of(tmp_path, rounds, method):
    """The loop of a ``rounds``-round one_round_args run whose server part is ``method`` (not yet fitted)."""
    parser, cfg = parse_fit(one_round_args(tmp_path, "--federation.rounds", str(rounds),
                                           "--federation.private_epochs", "1", "--federation.public_epochs", "1"))
    loop = Experiment(cfg, parser).loop
    loop.server_side.method = method
    return loop


def pair_spec(private, shared=None):
    """A MutualPair model spec (FML, FedKD): a private network and the shared one paired with it."""
    return {"class_path": "fdlit.models.mutual.MutualPair",
            "init_args": {"private": private, **({"shared": shared} if shared else {})}}


def shared(loop, i=0):
    """Client ``i``'s shared network's exchanged tensors, flat."""
    return flatten(exchanged_tensors(find_pair(loop.view.clients[i].model).shared))


def private(loop, i=0):
    """Client ``i``'s private network's parameters, flat."""
    return flatten(list(find_pair(loop.view.clients[i].model).private.parameters()))


# three architectures, one penultimate width (16), so the methods that exchange features apply too
NETWORKS = [
    {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}, "clients": [0]},
    {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32, 16]}, "clients": [1]},
    {"class_path": "fdlit.models.SmallCNN", "init_args": {"channels": 4, "hidden": 16}, "clients": [2, 3]},
]


def kill_once_checkpointed(victim, run_dir: Path, at_round: int, timeout: float) -> Path | None:
    """SIGKILL the ``victim`` process as soon as a run below ``run_dir`` has checkpointed round ``at_round``
    (checkpoints are renamed into place, so reading one is safe); returns that run's folder, or None when
    the victim ended or ``timeout`` passed first."""
    from fdlit.runs.checkpoint import load_checkpoint

    folder, deadline = None, time.time() + timeout
    while time.time() < deadline and victim.poll() is None:
        found = list(Path(run_dir).glob("*/checkpoint.pt"))
        if found and load_checkpoint(found[0])["loop"]["round"] >= at_round:
            folder = found[0].parent
            break
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=60)
    return folder
