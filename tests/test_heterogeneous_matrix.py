"""The heterogeneous-architecture row of the composition matrix: every shipped digits config with three
different client networks (``fdlit.models.PerClient``). A method either runs (finite accuracies, each
round's bytes in the ledger, no parameter vector sent) or is refused before any work with one line
naming the model; which methods are refused is listed here, so a method that starts refusing, or
one that stops refusing, fails."""

import importlib
import json
import math
from pathlib import Path

import pytest
import yaml

from fdlit.cli import main
from fdlit.clients.features import split_network
from fdlit.configuration.schema import parse_fit
from fdlit.methods.fedavg import FedAvg, FedAvgClient
from fdlit.models.build import build_model
from fdlit.runs.experiment import Experiment
from tests.fitting import NETWORKS, RULES, tiny

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# the methods that average parameter vectors: they need one architecture
REFUSED = {
    "digits_f2l_fedavg.yaml": "F2L (parameters)",
    "digits_fedavg.yaml": "FedAvg",
    "digits_feddf.yaml": "FedDF",
    "digits_fedgo_fedavg.yaml": "FedGO (parameters)",
    "digits_fedmedian.yaml": "FedMedian",
    "digits_fedprox.yaml": "FedProx",
    "digits_fedtrimmedmean.yaml": "FedTrimmedMean",
    "digits_krum.yaml": "Krum",
    "digits_scaffold.yaml": "SCAFFOLD",
}
# the two-network methods average the shared network: the private networks may differ (tests/test_fml.py),
# but each client's shared network here is a copy of its own private one, so three shared architectures
REFUSED_SHARED = {"digits_fml.yaml": "FML", "digits_fedkd.yaml": "FedKD"}


def heterogeneous(rule, run_dir):
    """``tiny`` with the PerClient networks in place of its MLP."""
    argv = tiny(rule, run_dir)
    at = argv.index("--model")
    del argv[at:at + 4]  # --model fdlit.models.MLP --model.hidden [16]
    return [*argv, "--model", "fdlit.models.PerClient", "--model.groups", json.dumps(NETWORKS)]


def method_class(rule):
    """The aggregator class a digits config names (through its method file)."""
    layers = yaml.safe_load((CONFIGS / rule).read_text())["config"]
    (method,) = [layer for layer in layers if layer.startswith("methods/")]
    module, _, name = yaml.safe_load((CONFIGS / method).read_text())["aggregator"]["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)


def finite(values):
    return all(isinstance(v, float) and math.isfinite(v) for v in values)


@pytest.mark.parametrize("rule", [r for r in RULES if r not in REFUSED and r not in REFUSED_SHARED])
def test_the_method_runs_with_three_client_networks(rule, tmp_path):
    parser, cfg = parse_fit(heterogeneous(rule, tmp_path))
    loop = Experiment(cfg, parser).loop
    loop.fit()
    nets = [split_network(c.model)[1] for c in loop.view.clients]
    assert [type(n).__name__ for n in nets] == ["MLP", "MLP", "SmallCNN", "SmallCNN"]
    assert len({sum(p.numel() for p in n.parameters()) for n in nets}) == 3  # three architectures
    assert loop.round == 2 and len(loop.history) == 2
    for m in loop.history:
        assert finite([m["after_private/global_acc_mean"], m["after_public/global_acc_mean"]])
        assert len(m["clients/after_public/global_acc"]) == 4 and finite(m["clients/after_public/global_acc"])
        assert loop.server_side.ledger.total("up", round=m["round"]) > 0  # the round's uploads are counted
    assert loop.server_side.ledger.total("up") == loop.history[-1]["comm/up_bytes_total"]
    assert not any(x.kind == "parameters" for x in loop.server_side.ledger.messages)


REFUSALS = {**{rule: f"model.class_path: {name} averages the clients' parameters, so every client needs the "
                    "same architecture" for rule, name in REFUSED.items()},
            **{rule: f"model.init_args.groups: {name} averages the shared network, so it must be the same for "
                    "every client" for rule, name in REFUSED_SHARED.items()}}


@pytest.mark.parametrize("rule", sorted(REFUSALS))
def test_the_method_is_refused_before_any_work_in_one_line(rule, tmp_path, capsys):
    assert main(["fit", *heterogeneous(rule, tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: {REFUSALS[rule]}")
    assert not list(tmp_path.rglob("metrics.jsonl"))  # nothing ran


def test_the_refused_methods_really_cannot_apply():
    """Each refused method sends its whole parameter vector and averages those vectors; the three
    networks hold vectors of three lengths, so there is nothing to average."""
    sizes = {sum(p.numel() for p in build_model(spec, (1, 8, 8), 10).parameters()) for spec in NETWORKS}
    assert len(sizes) == 3
    for rule in REFUSED:
        cls = method_class(rule)
        assert issubclass(cls, FedAvg) and cls.exchange == "parameters", rule
        assert isinstance(cls().client_part(), FedAvgClient), rule
    for rule in set(RULES) - set(REFUSED) - set(REFUSED_SHARED):  # and no method that runs is one of them
        assert not issubclass(method_class(rule), FedAvg), rule


def test_the_list_covers_every_shipped_config():
    assert set(REFUSED) | set(REFUSED_SHARED) <= set(RULES) and len(RULES) - len(REFUSED) >= 20


def test_fedgen_sharing_parameters_is_refused_in_one_line_while_its_default_runs(tmp_path, capsys):
    """FedGen's default (``share: auto``) runs HtFLlib's ``heads`` in the matrix above; its paper setting
    averages whole networks and, named, is refused like FedAvg."""
    argv = [*heterogeneous("digits_fedgen.yaml", tmp_path), "--aggregator.share", "parameters"]
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: model.class_path: FedGen (share: parameters) averages "
                                               "the clients' parameters, so every client needs the same architecture")
    assert not list(tmp_path.rglob("metrics.jsonl"))
