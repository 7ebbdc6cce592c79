"""The loop, the client and the communication accounting, on small digits federations."""

import pytest
import torch

from fdlit.callbacks import FederationCallback
from fdlit.clients import ClientModule, ClientOptimization
from fdlit.data import FederatedData
from fdlit.federation import FederationLoop, NumericalFault
from fdlit.federation.construction import eval_rows
from fdlit.messages import PUBLIC_LOGITS, Upload
from fdlit.methods import ProbabilityAveraging, UncertaintyWeighted
from fdlit.methods.base import ClientPart
from fdlit.models import MLP


def small_loop(tmp_path, aggregator, rounds=2, **kw):
    return FederationLoop(
        rounds=rounds, private_epochs_first=2, private_epochs=1, public_epochs_first=1, public_epochs=1,
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=200),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}},
        aggregator=aggregator, **kw,
    )


def test_avg_upload_is_n_c_4_bytes_per_client_per_round(tmp_path):
    loop = small_loop(tmp_path, ProbabilityAveraging())
    loop.fit()
    n, c, m = 200, 10, 4
    for r in (1, 2):
        for i in range(m):
            assert loop.server_side.ledger.total("up", round=r, client=i) == n * c * 4
            assert loop.server_side.ledger.total("down", round=r, client=i) == n * c * 4  # the teacher, broadcast
    assert loop.history[-1]["comm/up_bytes_total"] == 2 * m * n * c * 4
    assert loop.history[-1]["weights/chi"] == pytest.approx(1 / m)


def test_uwa_counts_its_density_model_and_half_precision_halves_logits(tmp_path):
    loop = small_loop(tmp_path, UncertaintyWeighted(), rounds=1, message_dtype="float16")
    loop.fit()
    for i, cd in enumerate(loop.data.clients):
        k = len(cd.classes)  # every class has >= 2 calibration samples here
        expected = 200 * 10 * 2 + 2 * k * 10 * 4 + k * 2  # fp16 logits + fp32 means/stds + int16 class ids
        assert loop.server_side.ledger.total("up", client=i) == expected
    kinds = {m.kind for m in loop.server_side.ledger.messages}
    assert kinds == {"logits", "gmm_means", "gmm_stds", "gmm_classes", "teacher"}


def test_scores_upload_sends_n_floats(tmp_path):
    loop = small_loop(tmp_path, UncertaintyWeighted(upload="scores"), rounds=1)
    loop.fit()
    assert loop.server_side.ledger.total("up", client=0) == 200 * 10 * 4 + 200 * 4


def test_hooks_are_called_in_order_and_optimizer_state_persists(tmp_path):
    calls = []

    class ExtraStatClient(ClientPart):
        uploads = (PUBLIC_LOGITS, Upload("extra_stat", shape=(3,)))

        def upload(self, ctx):
            calls.append(f"client{ctx.client.client_id}")
            assert ctx.public_logits.shape == (200, 10)
            return {"extra_stat": torch.zeros(3)}  # uploaded and counted

    class ExtraStat(ProbabilityAveraging):
        def client_part(self):
            return ExtraStatClient()

    class Recorder(FederationCallback):
        def on_fit_start(self, loop):
            calls.append("fit_start")

        def on_round_start(self, loop, round):
            calls.append(f"round_start{round}")

        def on_round_end(self, loop, round, metrics):
            calls.append(f"round_end{round}")

        def on_fit_end(self, loop, summary):
            calls.append("fit_end")

    loop = small_loop(tmp_path, ExtraStat(), callbacks=[Recorder()])
    loop.fit()
    assert calls == ["fit_start", "round_start1", "client0", "client1", "client2", "client3", "round_end1",
                     "round_start2", "client0", "client1", "client2", "client3", "round_end2", "fit_end"]
    assert loop.server_side.ledger.total("up", client=0, round=1) == 200 * 10 * 4 + 3 * 4
    # Adam's step counter keeps counting across rounds and phases: state persists
    opt = loop.view.clients[0].configure_optimizers()
    steps = next(iter(opt.state.values()))["step"]
    n_train = len(loop.data.clients[0].train)
    per_epoch = -(-n_train // 32) - (1 if n_train % 32 == 1 else 0)
    public = -(-200 // 32)
    assert int(steps) == 3 * per_epoch + 2 * public


def test_callbacks_get_a_read_only_view_of_the_run_not_the_loop(tmp_path):
    # fdlit.callbacks / docs/extending.md "Callbacks": hooks see the run's RoundView, never the loop's steps
    from fdlit.callbacks import RoundView

    seen = []

    class Look(FederationCallback):
        def on_round_end(self, view, round, metrics):
            assert not hasattr(view, "run_round") and not hasattr(view, "parts") and not hasattr(view, "settings")
            with pytest.raises(AttributeError):
                view.round = 7  # read-only
            members = {n for n in dir(RoundView) if not n.startswith("_")}
            assert members <= set(dir(view)) and not {n for n in dir(view) if not n.startswith("_")} - members
            seen.append((view.round, view.rounds, len(view.history), view.history[-1] is metrics,
                         len(view.clients), view.ledger.total("up", round=round) > 0,
                         view.state_dict()["round"], view.summary()["rounds"]))

    loop = small_loop(tmp_path, ProbabilityAveraging(), callbacks=[Look()])
    loop.fit()
    assert seen == [(1, 2, 1, True, 4, True, 1, 1), (2, 2, 2, True, 4, True, 2, 2)]


def test_first_round_epochs_differ(tmp_path):
    loop = small_loop(tmp_path, ProbabilityAveraging(), rounds=1)
    loop.settings.private_epochs_first, loop.settings.public_epochs_first = 3, 0
    loop.fit()
    steps = int(next(iter(loop.view.clients[0].configure_optimizers().state.values()))["step"])
    n_train = len(loop.data.clients[0].train)
    assert steps == 3 * (-(-n_train // 32) - (1 if n_train % 32 == 1 else 0))


def test_kd_loss_is_cross_entropy_against_teacher_probabilities():
    client = ClientModule(MLP((1, 8, 8), 10, hidden=[8]), 0, [0, 1], ClientOptimization())
    x = torch.randn(5, 1, 8, 8)
    p = torch.softmax(torch.randn(5, 10), -1)
    logits = client(x)
    expected = -(p * torch.log_softmax(logits, -1)).sum(-1).mean()
    torch.testing.assert_close(client.training_step((x, p)), expected)
    y = torch.tensor([0, 1, 1, 0, 1])
    torch.testing.assert_close(client.training_step((x, y)), torch.nn.functional.cross_entropy(logits, y))


def test_client_state_moves_between_clients():
    opt = ClientOptimization()
    a = ClientModule(MLP((1, 8, 8), 10, hidden=[8]), 0, [0], opt)
    b = ClientModule(MLP((1, 8, 8), 10, hidden=[8]), 0, [0], opt)
    loss = a.training_step((torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])))
    loss.backward()
    a.configure_optimizers().step()
    torch.randperm(10, generator=a.generator)
    b.load_client_state(a.client_state())
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(a(x), b(x))
    assert torch.equal(torch.randperm(10, generator=a.generator), torch.randperm(10, generator=b.generator))


def test_nan_in_a_client_stops_with_client_round_and_phase(tmp_path):
    class Poison(FederationCallback):
        def on_round_start(self, loop, round):
            if round == 2:
                with torch.no_grad():
                    next(loop.clients[1].parameters()).fill_(float("nan"))

    loop = small_loop(tmp_path, ProbabilityAveraging(), callbacks=[Poison()])
    with pytest.raises(NumericalFault, match="client 1 .* round 2, phase 'private'"):
        loop.fit()
    assert loop.round == 1 and len(loop.history) == 1  # round 1 completed


def test_same_seed_same_metrics(tmp_path):
    a = small_loop(tmp_path / "a", UncertaintyWeighted(), seed=5)
    b = small_loop(tmp_path / "b", UncertaintyWeighted(), seed=5)
    a.fit(), b.fit()
    def strip(h):
        return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in h]
    assert strip(a.history) == strip(b.history)


def test_accuracies_are_micro_and_match_torchmetrics(tmp_path):
    from torchmetrics.functional.classification import multiclass_accuracy

    loop = small_loop(tmp_path, ProbabilityAveraging(), rounds=1)
    loop.fit()
    acc = loop.parts.evaluate()
    preds = loop.settings.executor.predict(loop.view.clients, loop.parts.tensors.test_x).argmax(-1)
    for i, cd in enumerate(loop.data.clients):
        mask = torch.isin(loop.parts.tensors.test_y, torch.tensor(cd.classes))
        assert float(acc["global_acc"][i]) == pytest.approx(
            float(multiclass_accuracy(preds[i], loop.parts.tensors.test_y, 10, average="micro")))
        assert float(acc["local_acc"][i]) == pytest.approx(
            float(multiclass_accuracy(preds[i][mask], loop.parts.tensors.test_y[mask], 10, average="micro")))


def test_float64_precision_runs_with_the_uwa_calibration_hook(fast_args):
    """64-true: the sUWA hook calls predict_logits on float32 calibration data outside Fabric; the
    client casts to its parameters' dtype (it used to stop with a Float/Double matmul error). Both
    executors end at the same metrics."""
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    histories = []
    for executor in ("fdlit.execution.SequentialExecutor", "fdlit.execution.VectorizedExecutor"):
        parser, cfg = parse_fit(fast_args + ["--federation.precision", "64-true", "--federation.executor", executor])
        experiment = Experiment(cfg, parser)
        loop = experiment.loop
        loop.fit()
        assert next(loop.view.clients[0].model.parameters()).dtype == torch.float64
        histories.append(loop.history)
    for a, b in zip(*histories, strict=True):
        assert a["after_public/global_acc_mean"] == pytest.approx(b["after_public/global_acc_mean"], abs=1e-9)
        assert a["teacher/acc"] == pytest.approx(b["teacher/acc"], abs=1e-9)


def test_ledger_state_round_trips_in_columns_and_reads_the_row_format():
    """The checkpoint keeps the ledger as one list per field (every round saves the whole run's
    messages); loading gives the same messages, and checkpoints with per-message rows still load."""
    from fdlit.federation.communication import CommunicationLedger

    ledger = CommunicationLedger()
    ledger.send(1, 0, "up", "logits", torch.zeros(5, 10))
    ledger.send(1, 1, "up", "mask", torch.zeros(17, dtype=torch.bool))
    ledger.send(2, 0, "down", "teacher", torch.zeros(4, 10, dtype=torch.float16))
    state = ledger.state_dict()
    assert state["columns"]["bytes"] == [200, 3, 80] and state["columns"]["shape"][2] == (4, 10)
    for source in (state, {"messages": ledger.rows()}):  # columnar, and the earlier row format
        restored = CommunicationLedger()
        restored.load_state_dict(source)
        assert restored.messages == ledger.messages
    empty = CommunicationLedger()
    empty.load_state_dict(CommunicationLedger().state_dict())
    assert empty.messages == []
    assert ledger.rows(2) == [{"round": 2, "client": 0, "direction": "down", "kind": "teacher",
                               "dtype": "float16", "shape": (4, 10), "bytes": 80}]


# ---------------------------------------------------------------------------------- evaluation cadence
def test_evaluation_every_n_rounds_on_a_fixed_subsample_then_the_full_test_set_last(tmp_path):
    """Rounds 1, 2, 4 evaluated on the same 50 test samples, round 3 not at all, round 5 (the last)
    on the whole test set; training is unchanged, so round 5 equals a run evaluated every round."""
    loop = small_loop(tmp_path, UncertaintyWeighted(), rounds=5, eval_every_n_rounds=2, eval_subsample=50)
    loop.fit()
    ref = small_loop(tmp_path, UncertaintyWeighted(), rounds=5)
    ref.fit()
    total = len(loop.parts.tensors.test_y)
    assert [m["eval/test_samples"] for m in loop.history] == [50, 50, 0, 50, total]
    assert [m["eval/test_samples"] for m in ref.history] == [total] * 5
    skipped = loop.history[2]
    assert all(skipped[f"{p}/{n}_{s}"] != skipped[f"{p}/{n}_{s}"]  # NaN
               for p in ("after_private", "after_public") for n in ("global_acc", "local_acc") for s in ("mean", "min", "max"))
    assert not any(k.startswith("clients/after_") for k in skipped)
    assert skipped["teacher/acc"] == ref.history[2]["teacher/acc"]  # the round itself ran as usual
    last, ref_last = loop.history[-1], ref.history[-1]
    assert {k: v for k, v in last.items() if not k.startswith("time/")} == \
        {k: v for k, v in ref_last.items() if not k.startswith("time/")}

    # the subsample: fixed by the seed, sorted, and the accuracies are those of these rows
    rows = loop.parts.facts.eval_rows
    assert len(rows) == 50 and torch.equal(rows, rows.sort().values)
    assert torch.equal(rows, eval_rows(50, total, loop.seed))
    preds = loop.settings.executor.predict(loop.view.clients, loop.parts.tensors.test_x).argmax(-1)[:, rows]
    acc = (preds == loop.parts.tensors.test_y[rows]).float().mean(1)
    torch.testing.assert_close(loop.parts.evaluate(rows)["global_acc"], acc)

    summary = loop.summary()
    evaluated = [m for m in loop.history if m["eval/test_samples"]]
    assert summary["best_global_acc_mean"] == max(m["after_public/global_acc_mean"] for m in evaluated)
    assert summary["final_round"] == 5 and summary["final_test_samples"] == total
    assert summary["final_global_acc_mean"] == ref.summary()["final_global_acc_mean"]


def test_summary_uses_only_evaluated_rounds(tmp_path):
    loop = small_loop(tmp_path, ProbabilityAveraging(), rounds=3, eval_every_n_rounds=3)
    loop.setup()
    nan = float("nan")

    def row(r, acc, n):
        return {"round": r, "after_public/global_acc_mean": acc, "after_private/global_acc_mean": acc,
                "after_public/local_acc_mean": acc, "after_private/local_acc_mean": acc, "teacher/acc": 0.5,
                "eval/test_samples": n}

    loop.history = [row(1, 0.3, 360), row(2, nan, 0)]  # mid-run: the newest round was not evaluated
    loop.round = 2
    summary = loop.summary()
    assert summary["best_global_acc_mean"] == 0.3 and summary["best_round"] == 1
    assert summary["final_round"] == 1 and summary["final_global_acc_mean"] == 0.3
    loop.history = [row(1, nan, 0), row(2, 0.2, 360), row(3, 0.1, 360)]  # NaN first must not win max()
    assert loop.summary()["best_round"] == 2


@pytest.mark.parametrize("kwargs, field", [({"eval_every_n_rounds": 0}, "federation.eval_every_n_rounds"),
                                           ({"eval_subsample": 0}, "federation.eval_subsample")])
def test_bad_evaluation_settings_name_their_field(tmp_path, kwargs, field):
    from fdlit.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        small_loop(tmp_path, ProbabilityAveraging(), **kwargs)
