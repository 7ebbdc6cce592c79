"""Selection without the test set: a validation split carved from the private pool, measured in
evaluated rounds, and the summary / report / sweeps choosing the round by it."""

import json
import math

import numpy as np
import pytest
import torch
import yaml

import fdlit.execution
from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.federation import FederationLoop
from fdlit.federation.measurement import selected
from fdlit.methods import ProbabilityAveraging
from fdlit.reporting import load_runs, write_report


def test_validation_split_is_disjoint_stratified_and_taken_from_the_private_pool():
    base = FederatedData(num_clients=10, classes_per_client=3, public_size=300).setup(0)
    d = FederatedData(num_clients=10, classes_per_client=3, public_size=300, validation_size=100).setup(0)
    test, pub = set(d._test_source_index.tolist()), set(d._public_source_index.tolist())
    pool, val = set(d._pool_source_index.tolist()), set(d._validation_source_index.tolist())
    assert len(val) == len(d.validation) == 100
    assert not val & test and not val & pub and not val & pool
    assert len(test) + len(pub) + len(pool) + len(val) == 1797
    # carved from the private pool: test and public sets are those of a run without validation
    assert test == set(base._test_source_index.tolist()) and pub == set(base._public_source_index.tolist())
    assert val <= set(base._pool_source_index.tolist())
    assert np.bincount(d.validation.y.numpy(), minlength=10).min() >= 8  # stratified: ~10 per class
    # no client trains or calibrates on a validation sample
    for c in d.clients:
        assert not set(d._pool_source_index[c.pool_index].tolist()) & val
    frac = FederatedData(num_clients=10, classes_per_client=3, public_size=300, validation_size=0.1).setup(0)
    assert len(frac.validation) == round(0.1 * len(base.pool))


def test_no_validation_by_default_and_every_split_is_as_before():
    a = FederatedData(num_clients=6, classes_per_client=2, public_size=200).setup(3)
    b = FederatedData(num_clients=6, classes_per_client=2, public_size=200, validation_size=0).setup(3)
    assert a.validation is None and b.validation is None
    for ca, cb in zip(a.clients, b.clients, strict=True):
        assert np.array_equal(ca.pool_index, cb.pool_index) and torch.equal(ca.train.y, cb.train.y)


@pytest.mark.parametrize("value", [-1, 1.0, 1.5, 0.0, True, 10_000])
def test_bad_validation_size_names_the_field(value):
    with pytest.raises(ConfigError, match="data.validation_size"):
        FederatedData(num_clients=10, validation_size=value).setup(0)


def tiny_loop(**data):
    return FederationLoop(
        rounds=3, private_epochs_first=1, private_epochs=1, public_epochs_first=1, public_epochs=1,
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=120, **data),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}},
        aggregator=ProbabilityAveraging(), eval_every_n_rounds=3,  # rounds 1 and 3 evaluated
    )


def test_evaluated_rounds_measure_validation_accuracy_and_the_summary_selects_by_it():
    loop = tiny_loop(validation_size=60)
    summary = loop.fit()
    for phase in ("after_private", "after_public"):
        values = [m[f"{phase}/val_acc_mean"] for m in loop.history]
        assert 0 <= values[0] <= 1 and math.isnan(values[1]) and 0 <= values[2] <= 1  # evaluated rounds only
    last = loop.history[-1]
    preds = loop.settings.executor.predict(loop.view.clients, loop.parts.tensors.val_x).argmax(-1)
    torch.testing.assert_close(last["after_public/val_acc_mean"], float((preds == loop.parts.tensors.val_y).float().mean()))
    assert len(loop.parts.tensors.val_y) == 60
    for phase, suffix in (("after_public", ""), ("after_private", "_after_private")):
        rows = [m for m in loop.history if not math.isnan(m[f"{phase}/val_acc_mean"])]
        chosen = max(rows, key=lambda m: m[f"{phase}/val_acc_mean"])
        assert summary[f"selected_round{suffix}"] == chosen["round"]
        assert summary[f"selected_global_acc_mean{suffix}"] == chosen[f"{phase}/global_acc_mean"]
    # without a validation set: no validation metrics, no selection
    plain = tiny_loop()
    assert not any("selected" in k for k in plain.fit()) and "after_public/val_acc_mean" not in plain.history[0]


def subsampled_loop(executor="SequentialExecutor", rounds=6, **settings):
    return FederationLoop(
        rounds=rounds, private_epochs_first=2, private_epochs=2, public_epochs_first=1, public_epochs=1,
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=120, validation_size=60),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}},
        client=ClientOptimization(optimizer="adam", lr=0.05),  # plateaus early: the best round is not the last
        aggregator=ProbabilityAveraging(), executor=getattr(fdlit.execution, executor)(), **settings)


@pytest.mark.parametrize("executor", ["SequentialExecutor", "VectorizedExecutor"])
def test_the_selected_round_is_exact_on_the_whole_test_set_when_the_curves_use_a_subsample(executor):
    """The curves use a test subsample; the validation-selected numbers are those of a run that
    measured every round on the whole test set, and the final weights are left as they were."""
    full, sub = subsampled_loop(executor), subsampled_loop(executor, eval_subsample=50)
    exact, curves = full.fit(), sub.fit()
    n = len(full.parts.tensors.test_y)
    for a, b in zip(full.history, sub.history, strict=True):
        for phase in ("after_private", "after_public"):
            assert a[f"{phase}/val_acc_mean"] == b[f"{phase}/val_acc_mean"]  # the same training either way
            assert b[f"{phase}/test_samples"] == (n if b["round"] == 6 else 50)
    for suffix in ("", "_after_private"):
        assert curves[f"selected_round{suffix}"] == exact[f"selected_round{suffix}"]
        assert curves[f"selected_global_acc_mean{suffix}"] == exact[f"selected_global_acc_mean{suffix}"]
        assert curves[f"selected_test_samples{suffix}"] == n
    assert curves["selected_round"] < 6 or curves["selected_round_after_private"] < 6  # a kept round was used
    assert "selection/after_public/round" in sub.history[-1] or "selection/after_private/round" in sub.history[-1]
    # the final weights were restored after measuring the kept ones
    assert sub.history[-1]["after_public/global_acc_mean"] == full.history[-1]["after_public/global_acc_mean"]
    states = [run.settings.executor.fetch_states(run.view.clients) for run in (full, sub)]
    for x, y in zip(*states, strict=True):
        assert all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"])


def test_a_run_stopped_and_resumed_keeps_the_selected_weights(tmp_path):
    whole = subsampled_loop(eval_subsample=50)
    expected = whole.fit()
    first = subsampled_loop(eval_subsample=50, rounds=3)
    first.fit()
    state = first.state_dict()
    assert state["selection"]["best"]  # the best rounds so far and their weights travel with the state
    resumed = subsampled_loop(eval_subsample=50)
    resumed.load_state_dict(state)
    got = resumed.fit()
    for key in ("selected_round", "selected_global_acc_mean", "selected_round_after_private",
                "selected_global_acc_mean_after_private"):
        assert got[key] == expected[key]


def test_selection_is_the_best_validation_round_not_the_best_test_round():
    loop = tiny_loop(validation_size=40)
    nan = float("nan")

    def row(r, test, val, n=360):
        out = {"round": r, "eval/test_samples": n, "teacher/acc": 0.5}
        for p in ("after_private", "after_public"):
            out.update({f"{p}/global_acc_mean": test, f"{p}/local_acc_mean": test, f"{p}/val_acc_mean": val})
        return out

    loop.setup()
    loop.history = [row(1, 0.50, 0.90), row(2, nan, nan, 0), row(3, 0.70, 0.60), row(4, 0.40, 0.90)]
    loop.round = 4
    s = loop.summary()
    assert s["best_global_acc_mean"] == 0.70 and s["best_round"] == 3  # test-best
    assert s["selected_global_acc_mean"] == 0.50 and s["selected_round"] == 1  # earliest best validation
    assert s["selected_global_acc_mean_after_private"] == 0.50 and s["selected_val_acc_mean"] == 0.90


def _run_dir(root, name, seed, rows):
    """A finished run directory whose summary is the loop's own summary of these metric rows."""
    path = root / name
    path.mkdir(parents=True)
    config = {"seed": seed, "data": {"dataset": "digits", "partition": "classes", "classes_per_client": 2},
              "aggregator": {"class_path": "fdlit.methods.ProbabilityAveraging"}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    best = max(r["after_public/global_acc_mean"] for r in rows)
    summary = {"finished": True, "rounds": len(rows), "best_global_acc_mean": best,
               **selected(rows)}
    (path / "summary.json").write_text(json.dumps(summary))


def test_report_table_ranks_by_validation_when_every_run_has_it(tmp_path):
    root = tmp_path / "runs"
    for seed, (a, b) in enumerate([(0.5, 0.8), (0.6, 0.9)]):
        # the test accuracy peaks in round 2, the validation accuracy in round 1
        _run_dir(root, f"avg-seed{seed}", seed, [
            {"round": 1, "after_public/global_acc_mean": a, "after_public/val_acc_mean": 0.9},
            {"round": 2, "after_public/global_acc_mean": b, "after_public/val_acc_mean": 0.7}])
    runs, _ = load_runs(root)
    assert sorted(r.best() for r in runs) == [0.5, 0.6]
    md = (write_report(root, formats=("png",)).parent / "table1.md").read_text()
    assert md.startswith("Validation-selected") and "55.00 ± 7.07" in md and "85.00" not in md, md
    # one run of the same setting without validation: the others keep theirs, never pooled with it
    _run_dir(root, "avg-seed2", 2, [{"round": 1, "after_public/global_acc_mean": 0.7}])
    runs, _ = load_runs(root)
    assert sorted(r.best() for r in runs) == [0.5, 0.6, 0.7]
    md = (write_report(root, out=tmp_path / "r2", formats=("png",)).parent / "table1.md").read_text()
    assert md.startswith("Validation-selected or best (per row)"), md
    assert "| AVG (validation-selected) | 55.00 ± 7.07 (n=2) | validation |" in md, md
    assert "| AVG (test-best) | 70.00 (n=1) | test |" in md, md


def test_a_network_state_kept_for_both_phases_is_measured_once(monkeypatch):
    """A local_only run's public phase changes nothing: both phases select the same round and
    weights, which the end of the run measures on the whole test set once, for both."""
    from fdlit.federation.selection import ExactSelection

    loop = subsampled_loop(eval_subsample=50, mode="local_only")
    calls = []
    real = ExactSelection.finish

    def counted(self):
        evaluate = self.evaluate
        self.evaluate = lambda rows=None: calls.append(rows) or evaluate(rows)
        try:
            return real(self)
        finally:
            self.evaluate = evaluate

    monkeypatch.setattr(ExactSelection, "finish", counted)
    summary = loop.fit()
    last = loop.history[-1]
    assert summary["selected_round"] < 6  # a kept (subsampled) round was measured again
    assert last["selection/after_public/round"] == last["selection/after_private/round"]
    assert last["selection/after_public/global_acc_mean"] == last["selection/after_private/global_acc_mean"]
    assert last["selection/after_public/test_samples"] == len(loop.parts.tensors.test_y)
    assert calls == [None]  # one whole-test evaluation for both phases
