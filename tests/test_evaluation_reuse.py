"""The evaluation after the exchange measures only the clients a step of the round reached; every
other client keeps its accuracies from after the private phase (no network state measured twice), and
the round's accuracies are those of measuring every client."""

import json

import pytest
import torch

from fdlit.configuration.schema import parse_fit
from fdlit.runs.experiment import Experiment
from tests.fitting import EXECUTORS, tiny

SAMPLED = ("--data.num_clients", "6", "--federation.participation.fraction", "0.5",
           "--federation.participation.dropout", "0.3")


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_after_the_exchange_only_the_reached_clients_are_measured_again(executor, tmp_path):
    parser, cfg = parse_fit(tiny("digits.yaml", tmp_path, *SAMPLED, "--federation.executor", EXECUTORS[executor],
                                 rounds=3))
    loop = Experiment(cfg, parser).loop
    loop.setup()
    parts = loop.parts
    measure, calls = parts.evaluate.__class__.__call__, []

    def spied(self, rows=None, ids=None):
        out = measure(self, rows, ids)
        calls.append((ids, out, measure(self, rows)))  # and every client, as measured now
        return out

    plans = []
    facts_plan = parts.facts.plan
    parts.facts.plan = lambda r: plans.append(facts_plan(r)) or plans[-1]
    type(parts.evaluate).__call__ = spied
    try:
        loop.fit()
    finally:
        type(parts.evaluate).__call__ = measure
    assert len(calls) == 2 * len(plans) == 6
    for plan, (private, exchanged) in zip(plans, zip(calls[::2], calls[1::2], strict=True), strict=True):
        assert private[0] is None  # after the private phase: everyone
        reached = sorted(plan.arrived)  # they received a teacher; the dropped ones trained before the evaluation
        assert exchanged[0] == reached and len(reached) < 6  # the exchange's receivers only
        metrics = loop.history[plan.round - 1]
        everyone = exchanged[2]
        assert metrics["after_public/global_acc_mean"] == pytest.approx(float(everyone["global_acc"].mean()), abs=0)
        assert metrics["after_public/local_acc_mean"] == pytest.approx(float(everyone["local_acc"].mean()), abs=0)
        assert torch.equal(everyone["global_acc"][reached], exchanged[1]["global_acc"])


@pytest.mark.parametrize("mode", ["fd", "local_only"])
def test_without_the_after_private_evaluation_the_rest_is_as_before(mode, tmp_path):
    """``federation.eval_after_private: false``: no after-private accuracy (NaN, as a round not
    evaluated), every after-public metric and the summary's after-public numbers as with it."""
    from fdlit.cli import main
    from fdlit.runs import read_jsonl
    from tests.fitting import only_run

    runs = {}
    for flag in ("true", "false"):
        assert main(["fit", *tiny("digits.yaml", tmp_path / flag, "--federation.mode", mode,
                                  "--federation.eval_after_private", flag)]) == 0
        runs[flag] = only_run(tmp_path / flag)
    with_it, without = (read_jsonl(runs[f] / "metrics.jsonl") for f in ("true", "false"))
    for a, b in zip(with_it, without, strict=True):
        assert a["after_private/global_acc_mean"] > 0 and b["after_private/global_acc_mean"] is None
        assert {k: v for k, v in a.items() if k.startswith("after_public/")} == \
               {k: v for k, v in b.items() if k.startswith("after_public/")}
    summary, full = (json.loads((runs[f] / "summary.json").read_text()) for f in ("false", "true"))
    for key in ("best_global_acc_mean", "final_global_acc_mean", "final_local_acc_mean_after_public"):
        assert summary[key] == full[key]
    assert summary["final_local_acc_mean_after_private"] is None and full["final_local_acc_mean_after_private"] > 0
