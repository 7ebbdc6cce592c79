"""The method contract: a method written the natural way from docs/extending.md (examples/ema_teacher.py)
trains the same under every executor, and its server state cannot silently mix public samples."""

import math

import pytest
import torch
import torch.nn.functional as F

from fdlit.cli import main
from fdlit.clients.client import ClientModule
from fdlit.clients.options import ClientOptimization
from fdlit.configuration.schema import parse_fit
from fdlit.methods.base import ClientPart, FederationInfo, ServerContext
from fdlit.runs.experiment import Experiment
from tests.fitting import EXAMPLES, EXECUTORS, fit_loop


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def ema_args(tmp_path, *extra):
    return ["--config", "digits.yaml", "--config", str(EXAMPLES / "ema_teacher.yaml"), "--logger.mode", "disabled",
            "--logger.progress", "false", "--logger.run_dir", str(tmp_path), "--federation.rounds", "2",
            "--federation.private_epochs_first", "2", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1", "--data.num_clients", "5",
            "--data.classes_per_client", "6", "--data.public_size", "120", "--model.hidden", "[16]", *extra]


def numbers(history):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "ray/")) and isinstance(v, float)}
            for m in history]


class KLAtTwo(ClientPart):
    """A public loss written as a plain batch mean (it never looks at padding)."""

    def loss(self, ctx):
        if ctx.phase != "public":
            return ctx.base
        return F.kl_div(F.log_softmax(ctx.logits / 2, -1), ctx.target, reduction="batchmean") * 4


def test_a_loss_that_ignores_padding_is_exact_on_a_padded_batch():
    torch.manual_seed(0)
    client = ClientModule(torch.nn.Linear(3, 4), 0, [0, 1], ClientOptimization())
    client.method_part = KLAtTwo()
    logits, target = torch.randn(5, 4), torch.softmax(torch.randn(5, 4), -1)
    real = client.public_loss(logits, target)
    # the vectorized executor pads the batch with zero-weight rows (any values)
    padded_logits = torch.cat([logits, 50 * torch.randn(3, 4)])
    padded_target = torch.cat([target, torch.softmax(torch.randn(3, 4), -1)])
    weight = torch.tensor([1.0] * 5 + [0.0] * 3)
    torch.testing.assert_close(client.public_loss(padded_logits, padded_target, weight), real, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("executor", ["vectorized", "ray"])
def test_the_ema_teacher_trains_as_it_does_one_client_at_a_time(executor, tmp_path, examples_on_path, request):
    extra = ["--federation.executor", EXECUTORS[executor]]
    if executor == "ray":
        request.getfixturevalue("ray_local")
        extra += ["--federation.executor.actor_executor", "sequential"]
    sequential = fit_loop(ema_args(tmp_path / "seq", "--federation.executor", EXECUTORS["sequential"]))
    other = fit_loop(ema_args(tmp_path / executor, *extra))
    assert sequential.history[-1]["train/public_loss_mean"] > 0
    if executor == "vectorized":  # every client trained in the vmapped step: a silent fallback fails here
        # 5 clients, 2 phases, 2 rounds
        assert other.settings.executor.trained == {"vectorized": 5 * 2 * 2, "sequential": 0}
    for a, b in zip(numbers(sequential.history), numbers(other.history), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert math.isclose(a[key], b[key], rel_tol=1e-6, abs_tol=1e-6) or (math.isnan(a[key]) and math.isnan(b[key])), key


def test_state_over_one_rounds_public_rows_is_refused_under_a_public_subset(tmp_path, examples_on_path, capsys):
    argv = ema_args(tmp_path, "--config", "studies/participation.yaml", "--federation.rounds", "3")
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: aggregator: EMATeacher keeps ema")
    assert "public_ids" in err[0]


def test_state_indexed_by_public_ids_runs_under_a_public_subset(tmp_path, examples_on_path):
    loop = fit_loop(ema_args(tmp_path, "--config", "studies/participation.yaml", "--federation.rounds", "3",
                        "--aggregator.init_args.full_public_set", "true"))
    assert loop.round == 3 and loop.server_side.method.ema.shape[0] == 120


def test_the_ema_over_public_ids_mixes_only_the_same_samples(examples_on_path):
    from ema_teacher import EMATeacher

    method = EMATeacher(beta=0.5, full_public_set=True)

    def round_with(ids, probs):
        info = FederationInfo(1, 0, 1, 2, torch.zeros(len(ids), 1), public_index=torch.tensor(ids), public_size=4)
        return method.aggregate([{"logits": probs.log()}], ServerContext(info)).teacher

    first = round_with([0, 1], torch.tensor([[0.9, 0.1], [0.2, 0.8]]))
    torch.testing.assert_close(first, torch.tensor([[0.9, 0.1], [0.2, 0.8]]))
    second = round_with([1, 3], torch.tensor([[0.6, 0.4], [0.5, 0.5]]))  # sample 1 again, sample 3 new
    torch.testing.assert_close(second, torch.tensor([[0.4, 0.6], [0.5, 0.5]]))


def test_configure_decides_what_each_client_is_sent_and_the_client_distils_from_its_own(tmp_path):
    from fdlit.messages import Message
    from fdlit.methods import ProbabilityAveraging

    class FirstRowsForClientZero(ProbabilityAveraging):
        def configure(self, message, client_ids, ctx):
            sent = super().configure(message, client_ids, ctx)
            keep = torch.zeros(len(ctx.info.public_x), dtype=torch.bool)
            keep[:10] = True
            sent[0] = Message({"teacher": message["teacher"][keep], "keep_mask": keep})
            return sent

    argv = ema_args(tmp_path, "--federation.rounds", "1", "--federation.public_epochs_first", "1",
                    "--client.public_batch_size", "8", "--federation.executor", EXECUTORS["vectorized"])
    argv[argv.index("--config", 2): argv.index("--config", 2) + 2] = []  # no EMA config: the rule below
    parser, cfg = parse_fit(argv)
    loop = Experiment(cfg, parser).loop
    loop.server_side.method = FirstRowsForClientZero()
    loop.fit()
    down = {(m.client, m.kind): m.shape for m in loop.server_side.ledger.messages
            if m.direction == "down" and m.round == 1}
    assert down[(0, "teacher")] == (10, 10) and (0, "keep_mask") in down
    assert down[(1, "teacher")] == (120, 10) and (1, "keep_mask") not in down

    def steps(client):
        return int(next(iter(client.configure_optimizers().state.values()))["step"])

    private = [steps(c) for c in loop.view.clients]  # the same private data sizes differ, so compare the public part
    sizes = [len(cd.train.y) for cd in loop.view.client_data]
    public = [s - 2 * -(-n // 32) + (2 if n % 32 == 1 else 0) for s, n in zip(private, sizes, strict=True)]
    assert public[0] == 2 and all(p == 15 for p in public[1:])  # 10 rows / 8 a batch vs 120 rows / 8


def test_a_method_exchanges_predictions_or_parameters_and_nothing_else():
    # docs/extending.md: ``exchange`` is "predictions" or "parameters"; the round has no other protocol
    from fdlit.errors import ConfigError
    from fdlit.federation import FederationLoop
    from fdlit.methods import ProbabilityAveraging

    class Gradients(ProbabilityAveraging):
        exchange = "gradients"

    with pytest.raises(ConfigError, match=r"^aggregator: Gradients.exchange is 'gradients'; allowed: predictions, "
                                         r"parameters$"):
        FederationLoop(aggregator=Gradients(), rounds=1)
