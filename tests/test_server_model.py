"""The server model (fdlit.federation.server), DS-FL and FedMD on tiny digits federations.

Off by default it changes nothing; on, it is distilled from whatever rule aggregates, evaluated
every round, sends nothing unless the method broadcasts it, and never touches the clients' random
numbers. FedMD's digest loss and transfer-learning warm-up are checked against their definitions."""

import math

import pytest
import torch

from fdlit.clients import ClientModule, ClientOptimization
from fdlit.configuration.schema import parse_fit
from fdlit.methods.base import context_for
from fdlit.methods.fedmd import FedMDDigest
from fdlit.models import MLP
from fdlit.runs.experiment import Experiment
from tests.fitting import fit_loop, tiny

SERVER = ["--server.model", "fdlit.models.MLP", "--server.model.hidden", "[16]",
          "--server.epochs_first", "1", "--server.epochs", "1"]


def ledger_rows(loop):
    return [(m.round, m.client, m.direction, m.kind, m.shape, m.bytes) for m in loop.server_side.ledger.messages]


def client_metrics(history):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "server/"))} for m in history]


def same(a, b):
    """Equal metric rows, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_off_by_default_on_without_broadcast_changes_nothing_and_broadcast_is_counted(tmp_path):
    off = fit_loop(tiny("digits.yaml", tmp_path / "off"))
    on = fit_loop(tiny("digits.yaml", tmp_path / "on", *SERVER))
    assert off.server_side.server_model is None and on.server_side.server_model is not None
    assert not any(k.startswith("server/") for m in off.history for k in m)
    assert "server_final_acc" not in off.summary() and 0 <= on.summary()["server_final_acc"] <= 1
    # its own random stream, no messages: every client metric and every byte as without it
    assert same(client_metrics(off.history), client_metrics(on.history))
    assert ledger_rows(off) == ledger_rows(on)
    for m in on.history:
        assert 0 <= m["server/acc"] <= 1 and m["server/nll"] > 0 and math.isfinite(m["server/distill_loss"])

    # broadcast: the server model's probabilities replace the teacher, counted as server_teacher
    quiet = on
    loud = fit_loop(tiny("digits.yaml", tmp_path / "loud", *SERVER, "--server.broadcast", "true"))
    down = [(r, c, k, s, b) for r, c, d, k, s, b in ledger_rows(loud) if d == "down"]
    assert down and {k for _, _, k, _, _ in down} == {"server_teacher"}
    # the same N x C numbers as the aggregated teacher it replaces
    assert [(r, c, s, b) for r, c, _, s, b in down] == [
        (r, c, s, b) for r, c, d, _, s, b in ledger_rows(quiet) if d == "down"]
    # the clients now distil from something else
    assert not same(client_metrics(quiet.history), client_metrics(loud.history))


@pytest.mark.parametrize("config", ["digits.yaml", "digits_dsfl.yaml"])  # sUWA and ERA as the teacher
def test_server_accuracy_is_logged_every_round_and_improves(config, tmp_path):
    # clients and server trained enough that the teacher (ERA's is flat early) carries its argmax
    loop = fit_loop(tiny(config, tmp_path, *SERVER, "--data.public_size", "400", "--client.lr", "0.01",
                         "--server.lr", "0.01", "--server.epochs_first", "3", "--server.epochs", "3",
                         "--federation.private_epochs_first", "3", "--federation.private_epochs", "3",
                         # every public row every round (DS-FL's config draws a tenth a round)
                         "--federation.participation.public_fraction", "1.0", rounds=3))
    accs = [m["server/acc"] for m in loop.history]
    assert len(accs) == 3 and all(0 <= a <= 1 for a in accs), accs
    assert accs[-1] > accs[0] + 0.1, accs
    assert loop.summary()["server_final_acc"] == accs[-1]


def test_a_rule_that_drops_samples_trains_the_server_on_the_kept_rows_only(tmp_path):
    parser, cfg = parse_fit(tiny("digits_selective_fd.yaml", tmp_path, *SERVER))
    loop = Experiment(cfg, parser).loop
    seen = []
    real = loop.server_side.server_model.round if loop.server_side.server_model is not None else None

    def spy(first, public_x, teacher, test):
        seen.append((len(public_x), len(teacher)))
        return real(first, public_x, teacher, test)

    loop.server_side.server_model.round = spy
    loop.fit()
    kept = [m.shape[0] for m in loop.server_side.ledger.messages if m.kind == "teacher" and m.client == 0]
    assert [n for n, _ in seen] == [n for _, n in seen] == kept
    assert min(kept) < 120  # the rule did drop rows


def test_fedmd_digest_is_l1_to_the_consensus_up_to_a_row_constant():
    client = ClientModule(MLP((4,), 3, hidden=[8]), 0, [0, 1, 2], ClientOptimization("adam", 1e-3))
    client.method_part = FedMDDigest()  # FedMD's client part, as the loop attaches it
    consensus = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]])
    teacher = consensus.softmax(-1)
    assert client.public_loss(consensus + torch.tensor([[5.0], [-7.0]]), teacher) < 1e-5
    logits = consensus + torch.tensor([[0.3, 0.0, 0.0], [0.0, 0.0, -0.9]])
    c = logits - logits.mean(-1, keepdim=True)
    t = consensus - consensus.mean(-1, keepdim=True)
    expected = (c - t).abs().mean(-1).mean()
    assert torch.allclose(client.public_loss(logits, teacher), expected, atol=1e-5)
    weight = torch.tensor([1.0, 0.0])
    assert torch.allclose(client.public_loss(logits, teacher, weight), (c - t).abs().mean(-1)[0], atol=1e-5)
    assert torch.equal(ClientModule(MLP((4,), 3, hidden=[8]), 0, [0, 1, 2], ClientOptimization("adam", 1e-3))
                       .public_loss(logits, teacher), torch.nn.functional.cross_entropy(logits, teacher))


def test_fedmd_warmup_trains_on_the_labelled_public_set_and_sends_nothing(tmp_path):
    def public_acc(loop):
        with torch.no_grad():
            x, y = loop.parts.tensors.public_x, loop.parts.tensors.public_y
            return [float((c(x).argmax(-1) == y).float().mean()) for c in loop.view.clients]

    loops = {}
    for epochs in (0, 5):
        parser, cfg = parse_fit(tiny("digits_fedmd.yaml", tmp_path / str(epochs), "--aggregator.warmup_epochs",
                                     str(epochs), "--client.lr", "0.01", "--data.public_size", "400"))
        loop = Experiment(cfg, parser).loop
        loop.setup()
        loop.protocol.public_warmup(loop.parts)
        loops[epochs] = loop
    assert loops[5].server_side.ledger.messages == []
    # every client learnt the public set's labels, beyond its own few classes
    warm, cold = public_acc(loops[5]), public_acc(loops[0])
    assert sum(warm) / len(warm) > sum(cold) / len(cold) + 0.3, (warm, cold)


def test_feddf_is_fedavg_plus_server_distillation(tmp_path):
    args = ("--client.optimizer", "sgd", "--client.lr", "0.05")
    fedavg = fit_loop(tiny("digits_fedavg.yaml", tmp_path / "avg", *args))
    zero = fit_loop(tiny("digits_feddf.yaml", tmp_path / "zero", *args, "--aggregator.epochs", "0"))
    feddf = fit_loop(tiny("digits_feddf.yaml", tmp_path / "df", *args, "--aggregator.epochs", "3"))
    # no distillation: FedAvg exactly; with it: the same messages and bytes, other models
    assert same(client_metrics(zero.history), client_metrics(fedavg.history))
    assert ledger_rows(feddf) == ledger_rows(fedavg)
    assert not same(client_metrics(feddf.history), client_metrics(fedavg.history))
    assert all(math.isfinite(m["feddf/distill_loss"]) for m in feddf.history)


def test_fedgo_as_published_weights_the_ensemble_by_discriminator_odds(tmp_path):
    from fdlit.methods import FedGOParams

    method = FedGOParams()
    logits = torch.randn(3, 5, 4)
    ctx = context_for([{"logits": z} for z in logits])
    method.fedgo.set_discriminator_scores(torch.zeros(3, 5), torch.tensor([10, 10, 10]))
    assert torch.allclose(method.ensemble(logits, ctx), logits.softmax(-1).mean(0), atol=1e-6)  # equal odds: AVG
    odds = torch.full((3, 5), -30.0)
    odds[1] = 0.0  # only client 1's discriminator claims the samples
    method.fedgo.set_discriminator_scores(odds, torch.tensor([10, 10, 10]))
    assert torch.allclose(method.ensemble(logits, ctx), logits[1].softmax(-1), atol=1e-5)

    args = ("--client.optimizer", "sgd", "--client.lr", "0.05", "--aggregator.discriminator_epochs", "2")
    loop = fit_loop(tiny("digits_fedgo_fedavg.yaml", tmp_path, *args))
    fedavg = fit_loop(tiny("digits_fedavg.yaml", tmp_path / "avg", *args[:4]))
    extra = [r for r in ledger_rows(loop) if r not in ledger_rows(fedavg)]
    # FedAvg's messages plus each client's N discriminator log-odds at set-up
    assert [(r, d, k, s) for r, _, d, k, s, _ in extra] == [(0, "up", "discriminator_log_odds", (120,))] * 4
