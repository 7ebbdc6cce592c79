"""COMET (Cho et al. 2023): each client distils from the centroid of its own cluster of predictions,
is sent (and charged for) its own targets, and runs with different networks per client."""

import json

import pytest
import torch

from fdlit.cli import main
from fdlit.clients.loss_context import LossContext
from fdlit.messages import Message
from fdlit.methods import COMET
from fdlit.methods.base import ServerContext, context_for
from tests.fitting import EXECUTORS, NETWORKS, fit_loop, ledger_rows, tiny

PARTIAL = ("--federation.participation.fraction", "0.5", "--federation.participation.dropout", "0.3",
           "--federation.participation.public_fraction", "0.25")


def test_each_client_is_sent_the_mean_of_its_own_cluster():
    # rows where clients 0, 1 agree on class 0 and clients 2, 3 on class 2
    a, b = torch.tensor([4.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 4.0])
    logits = [a + 0.1 * torch.randn(6, 3), a + 0.1 * torch.randn(6, 3), b + 0.1 * torch.randn(6, 3), b + 0.1 * torch.randn(6, 3)]
    uploads = [{"logits": z} for z in logits]
    ctx = context_for(uploads)
    method = COMET(num_clusters=2)
    result = method.aggregate(uploads, ctx)
    sent = method.configure(Message({"teacher": result.teacher}), [0, 1, 2, 3], ServerContext(ctx.info))
    probs = [z.softmax(-1) for z in logits]
    torch.testing.assert_close(sent[0]["teacher"], (probs[0] + probs[1]) / 2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sent[3]["teacher"], (probs[2] + probs[3]) / 2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.teacher, torch.stack(probs).mean(0))
    # one cluster: every client gets the plain mean
    single = COMET(num_clusters=1)
    single.aggregate(uploads, ctx)
    one = single.configure(Message({"teacher": result.teacher}), [0, 1, 2, 3], ServerContext(ctx.info))
    torch.testing.assert_close(one[2]["teacher"], torch.stack(probs).mean(0), rtol=1e-5, atol=1e-6)


def test_heterogeneous_client_networks_run_through_per_client(tmp_path):
    argv = tiny("digits_comet.yaml", tmp_path)
    at = argv.index("--model")
    del argv[at:at + 4]
    loop = fit_loop([*argv, "--model", "fdlit.models.PerClient", "--model.groups", json.dumps(NETWORKS)])
    assert loop.round == 2
    down = [m for m in loop.server_side.ledger.messages if m.direction == "down" and m.round >= 1]
    assert down and all(m.kind == "teacher" and m.shape == (12, 10) for m in down)  # 12 = a tenth of 120 rows
    assert {type(c.model).__name__ for c in loop.view.clients} >= {"MLP", "SmallCNN"}


def test_vectorized_equals_sequential_under_participation(tmp_path):
    seq = fit_loop(tiny("digits_comet.yaml", tmp_path / "seq", *PARTIAL, "--federation.executor", EXECUTORS["sequential"]))
    vec = fit_loop(tiny("digits_comet.yaml", tmp_path / "vec", *PARTIAL, "--federation.executor", EXECUTORS["vectorized"]))
    assert ledger_rows(vec) == ledger_rows(seq)
    assert [m["comet/largest_cluster_share"] for m in seq.history] == [m["comet/largest_cluster_share"] for m in vec.history]


def test_regularization_weight_scales_the_distillation_loss_only():
    assert not COMET().client_part().has_loss  # the authors' 1.0: the plain loss, every executor's default path
    part = COMET(regularization_weight=0.25).client_part()
    base = torch.tensor(2.0)
    public = LossContext(client=torch.nn.Identity(), phase="public", logits=torch.zeros(1, 3),
                         target=torch.zeros(1, 3), base=base, state={})
    private = LossContext(client=torch.nn.Identity(), phase="private", logits=torch.zeros(1, 3),
                          target=torch.zeros(1, dtype=torch.long), base=base, state={})
    assert float(part.loss(public)) == 0.5 and float(part.loss(private)) == 2.0


def test_zero_regularization_weight_leaves_sgd_clients_where_the_private_phase_left_them(tmp_path):
    loop = fit_loop(tiny("digits_comet.yaml", tmp_path, "--aggregator.init_args.regularization_weight", "0",
                         "--client.optimizer", "sgd", "--client.lr", "0.5"))
    evaluated = [m for m in loop.history if "after_public/global_acc_mean" in m]
    assert len(evaluated) == 2
    assert all(m["after_public/global_acc_mean"] == m["after_private/global_acc_mean"] for m in evaluated)
    assert any(m.kind == "teacher" for m in loop.server_side.ledger.messages)  # the targets still go down


@pytest.mark.parametrize(("flag", "value"), [("num_clusters", "0"), ("num_clusters", "true"),
                                             ("regularization_weight", "-1")])
def test_bad_settings_are_refused_in_one_line(flag, value, tmp_path, capsys):
    assert main(["fit", *tiny("digits_comet.yaml", tmp_path, f"--aggregator.init_args.{flag}", value)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: aggregator")
