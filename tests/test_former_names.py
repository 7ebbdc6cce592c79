"""The methods' former names (package ``fdlit.aggregators``, classes ending in ``Aggregator``) keep working:
configs that use them run, with a FutureWarning, and run directories written before the rename resume to
the same numbers. ``tests/legacy_runs/`` holds three such runs (sUWA, SCAFFOLD with client state, the
meta-model with a set-up exchange) stopped after round 1 by the code before the rename, with the metrics
and messages of the same run left uninterrupted for 2 rounds. The metrics are compared within a relative
1e-3: the vectorized executor that resumes them has since changed its matmul layout, which moves round 2
by float rounding (1e-7 relative; 3e-5 for the meta-model's teacher, refitted over 300 Adam steps), while
a resume that loses state (weights, optimizer moments, a method's set-up) moves it by far more."""

import shutil
import warnings
from pathlib import Path

import pytest

from fdlit.cli import main
from fdlit.methods.aliases import RENAMED, canonical_class_path
from fdlit.reporting import method_label
from fdlit.runs import read_jsonl

LEGACY = Path(__file__).resolve().parent / "legacy_runs"


# metrics added since those runs were written (each phase's number of test samples)
ADDED = ("after_private/test_samples", "after_public/test_samples")


def without_time(rows):
    return [{k: v for k, v in row.items() if not k.startswith("time/") and k not in ADDED} for row in rows]


def close(got, expected, rel=1e-3):
    """Equal structure and integers, floats within ``rel`` (nested lists and dicts alike)."""
    if isinstance(expected, dict):
        return isinstance(got, dict) and got.keys() == expected.keys() and all(
            close(got[k], expected[k], rel) for k in expected)
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(
            close(g, e, rel) for g, e in zip(got, expected, strict=True))
    if isinstance(expected, float):
        return got == pytest.approx(expected, rel=rel, abs=1e-9)
    return got == expected


@pytest.mark.parametrize("name", ["digits", "digits_scaffold", "digits_meta_model"])
def test_a_run_written_before_the_rename_resumes_to_the_uninterrupted_numbers(name, tmp_path):
    run = tmp_path / name
    shutil.copytree(LEGACY / name, run)
    assert "fdlit.aggregators." in (run / "config.yaml").read_text()  # really written with the former names
    assert main(["fit", "--resume", str(run), "--federation.rounds", "2"]) == 0
    assert close(without_time(read_jsonl(run / "metrics.jsonl")), without_time(
        read_jsonl(run / "expected_metrics.jsonl")))
    assert read_jsonl(run / "communication.jsonl") == read_jsonl(run / "expected_communication.jsonl")


def test_every_former_class_name_resolves_to_the_current_class_with_a_warning():
    import fdlit.methods

    for old, new in RENAMED.items():
        with pytest.warns(FutureWarning, match=f"{old} is a former name of {new}"):
            assert getattr(fdlit.methods, old) is getattr(fdlit.methods, new)


def test_the_former_package_is_the_same_modules_not_copies():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from fdlit.aggregators.uncertainty import SmoothedUncertaintyWeighted as OldModuleClass

        import fdlit.aggregators as old

    import fdlit.methods.uncertainty as current

    assert OldModuleClass is current.SmoothedUncertaintyWeighted  # isinstance and pickles agree
    with pytest.warns(FutureWarning):
        assert old.UncertaintyWeightedAggregator is current.UncertaintyWeighted
    assert old.FedAvg is fdlit_methods().FedAvg


def fdlit_methods():
    import fdlit.methods

    return fdlit.methods


def test_a_config_with_a_former_class_path_runs_and_warns(tmp_path):
    with pytest.warns(FutureWarning, match="former name"):
        assert main(["fit", "--config", "configs/digits.yaml", "--aggregator",
                     "fdlit.aggregators.ProbabilityAveragingAggregator", "--logger.mode", "disabled",
                     "--logger.progress", "false", "--logger.run_dir", str(tmp_path), "--federation.rounds", "1",
                     "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
                     "--data.num_clients", "5", "--data.public_size", "60"]) == 0


def test_reports_label_runs_by_current_names_whatever_path_they_were_written_with():
    assert canonical_class_path("fdlit.aggregators.SmoothedUncertaintyWeightedAggregator") == (
        "fdlit.methods.SmoothedUncertaintyWeighted")
    assert canonical_class_path("fdlit.aggregators.fedavg.FedAvg") == "fdlit.methods.fedavg.FedAvg"
    assert canonical_class_path("mypkg.MedianAggregator") == "mypkg.MedianAggregator"  # not ours: unchanged
    for path in ("fdlit.aggregators.SmoothedUncertaintyWeightedAggregator", "fdlit.methods.SmoothedUncertaintyWeighted"):
        config = {"aggregator": {"class_path": path, "init_args": {"tau": 0.5}}}
        assert method_label(config) == "sUWA τ=0.5"
    for path in ("fdlit.aggregators.ProbabilityAveragingAggregator", "fdlit.methods.ProbabilityAveraging"):
        assert method_label({"aggregator": {"class_path": path}}) == "AVG"
