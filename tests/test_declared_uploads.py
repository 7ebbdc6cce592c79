"""Declared uploads: a client part sends exactly the arrays it declares (``ClientPart.uploads``), the
ledger counts exactly those, the privacy release works on them, and anything else is refused."""

import math

import pytest
import torch

from fdlit.cli import main
from fdlit.configuration.schema import parse_fit
from fdlit.errors import ConfigError
from fdlit.messages import Upload
from fdlit.methods.base import ClientPart
from fdlit.runs.experiment import Experiment
from tests.fitting import GatedVotes, GatedVotesClient
from tests.fitting import one_round_args as args


class Leaky(GatedVotesClient):
    def upload(self, ctx):
        return {**super().upload(ctx), "raw": ctx.public_logits}


class LeakyVotes(GatedVotes):
    def client_part(self):
        return Leaky()


class MisshapenClient(GatedVotesClient):
    def upload(self, ctx):
        out = super().upload(ctx)
        return {**out, "mask": out["mask"][:-1]}


class MisshapenVotes(GatedVotes):
    def client_part(self):
        return MisshapenClient()


class ClearOnly(GatedVotes):
    def client_part(self):
        part = GatedVotesClient()
        part.uploads = (Upload("probs", "clear"), Upload("mask", "clear"))
        return part


def run(tmp_path, method, *extra):
    parser, cfg = parse_fit(args(tmp_path, *extra))
    loop = Experiment(cfg, parser).loop
    loop.server_side.method = method
    loop.fit()
    return loop


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_a_gated_upload_sends_exactly_its_declared_arrays_and_no_logits(tmp_path, executor):
    method = GatedVotes()
    loop = run(tmp_path, method, "--federation.executor", f"fdlit.execution.{executor.capitalize()}Executor")
    if executor == "vectorized":  # the vmapped step ran, not a fallback to one client at a time
        assert loop.settings.executor.trained == {"vectorized": 8, "sequential": 0}
    up = [m for m in loop.server_side.ledger.messages if m.direction == "up" and m.round == 1]
    assert {m.kind for m in up} == {"probs", "mask"}  # the server never receives the unmasked logits
    assert all(set(u) == {"probs", "mask"} for u in method.received) and len(method.received) == 4
    for u in method.received:  # kept rows only: fewer probability rows than public rows
        assert u["mask"] == (100,) and 50 <= u["probs"][0] < 100 and u["probs"][1] == 10
    kept = [m.shape[0] for m in up if m.kind == "probs"]
    assert sum(m.bytes for m in up) == sum(k * 10 * 4 for k in kept) + 4 * math.ceil(100 / 8)


def test_an_undeclared_upload_is_refused_naming_the_part_and_the_array(tmp_path):
    with pytest.raises(ConfigError, match=r"^aggregator: Leaky uploads 'raw', which its client part does not declare "
                                         r"\(uploads: probs, mask\)"):
        run(tmp_path, LeakyVotes())


def test_an_undeclared_upload_stops_the_command_line_run_in_one_line(tmp_path, capsys):
    assert main(["fit", *args(tmp_path, "--aggregator", "tests.test_declared_uploads.LeakyVotes")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: aggregator: Leaky uploads 'raw'")


def test_an_upload_that_does_not_fit_its_declared_shape_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^aggregator: MisshapenClient uploads 'mask', which has shape \(99,\), declared \('N',\)"):
        run(tmp_path, MisshapenVotes())


def test_differential_privacy_noises_the_declared_rows_of_a_method_without_logits(tmp_path):
    method = GatedVotes()
    loop = run(tmp_path, method, "--privacy.noise_multiplier", "1.0", "--privacy.clip_norm", "1.0")
    assert {m.kind for m in loop.server_side.ledger.messages if m.direction == "up"} == {"probs", "mask"}
    assert loop.history[-1]["privacy/noise_std_mean"] > 0 and loop.history[-1]["privacy/epsilon"] > 0


def test_differential_privacy_is_refused_for_a_method_with_nothing_to_privatise(tmp_path, capsys):
    argv = args(tmp_path, "--aggregator", "tests.test_declared_uploads.ClearOnly", "--privacy.noise_multiplier", "1.0")
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fdlit: error: privacy.noise_multiplier: ClearOnly declares no upload the mechanism can "
                              "privatise")


def test_the_gated_upload_docs_extending_shows_sends_what_it_declares():
    import re
    from pathlib import Path
    from types import SimpleNamespace

    from fdlit.methods.client_part import declared_payload

    text = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "class GatedVotesClient" in b)
    namespace = {"ClientPart": ClientPart, "torch": torch}
    exec(code, namespace)
    part = namespace["GatedVotesClient"]()
    logits = torch.tensor([[4.0, 0.0, 0.0], [0.1, 0.0, 0.0]])
    sent = declared_payload("GatedVotesClient", part.uploads, part.upload(SimpleNamespace(public_logits=logits)),
                            logits, rows=2, classes=3)
    assert list(sent) == ["probs", "mask"] and sent["mask"].tolist() == [True, False]
    assert sent["probs"].shape == (1, 3)


def numbers(history):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "ray/")) and isinstance(v, float)}
            for m in history]


def same_numbers(a, b):
    for x, y in zip(numbers(a.history), numbers(b.history), strict=True):
        assert x.keys() == y.keys()
        for key in x:
            assert math.isclose(x[key], y[key], rel_tol=1e-6, abs_tol=1e-6) or (
                math.isnan(x[key]) and math.isnan(y[key])), key


@pytest.mark.parametrize("executor", ["vectorized", "ray"])
def test_the_gated_votes_run_as_they_do_one_client_at_a_time(tmp_path, executor, request):
    extra = ["--federation.executor", f"fdlit.execution.{executor.capitalize()}Executor"]
    if executor == "ray":
        request.getfixturevalue("ray_local")
        extra += ["--federation.executor.actor_executor", "sequential"]
    rounds = ("--federation.rounds", "2", "--federation.private_epochs", "1", "--federation.public_epochs", "1")
    sequential = run(tmp_path / "seq", GatedVotes(), *rounds, "--federation.executor",
                     "fdlit.execution.SequentialExecutor")
    other = run(tmp_path / executor, GatedVotes(), *rounds, *extra)
    assert sequential.history[-1]["teacher/kept_fraction"] > 0
    same_numbers(sequential, other)


def test_the_gated_votes_resume_equal_to_an_uninterrupted_run(tmp_path):
    import io

    rounds = ("--federation.private_epochs", "1", "--federation.public_epochs", "1")
    straight = run(tmp_path / "a", GatedVotes(), "--federation.rounds", "2", *rounds)
    first = run(tmp_path / "b", GatedVotes(), "--federation.rounds", "1", *rounds)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    parser, cfg = parse_fit(args(tmp_path / "c", "--federation.rounds", "2", *rounds))
    resumed = Experiment(cfg, parser).loop
    resumed.server_side.method = GatedVotes()
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    resumed.fit()
    assert resumed.round == 2
    same_numbers(straight, resumed)


def test_a_messages_sensitivity_is_its_declared_kinds_and_cannot_be_stated_otherwise():
    # fdlit.messages: the sensitivity is set from the declaration (Upload.kind), never by hand
    from fdlit.messages import Message
    from fdlit.methods.client_part import declared_payload

    uploads = GatedVotesClient.uploads
    probs, mask = torch.rand(3, 10), torch.tensor([True, False, True, True])
    sent = declared_payload("GatedVotesClient", uploads, {"probs": probs, "mask": mask}, rows=4, classes=10)
    assert sent.sensitivity == {"probs": "rows", "mask": "clear"}
    stated = Message({"probs": probs, "mask": mask}, sensitivity={"mask": "clear"})  # agrees: kept
    assert declared_payload("GatedVotesClient", uploads, stated, rows=4, classes=10).sensitivity == sent.sensitivity
    with pytest.raises(ConfigError, match=r"^aggregator: GatedVotesClient sends 'probs' with sensitivity 'clear', "
                                         r"and its client part declares it 'rows'"):
        declared_payload("GatedVotesClient", uploads, Message({"probs": probs}, sensitivity={"probs": "clear"}),
                         rows=4, classes=10)
