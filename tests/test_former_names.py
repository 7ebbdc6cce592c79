"""The methods' former names (package ``fdlit.aggregators``, classes ending in ``Aggregator``, FedMD's
client class) are no aliases: a config, a flag or a sweep that names one is refused in one line giving
the current name, and run directories written with them resume under the current names to the same
numbers. ``tests/legacy_runs/`` holds three such runs (sUWA, SCAFFOLD with client state, the
meta-model with a set-up exchange) stopped after round 1 by the code before the rename, with the metrics
and messages of the same run left uninterrupted for 2 rounds. The metrics are compared within a relative
1e-3: the vectorized executor that resumes them has since changed its matmul layout, which moves round 2
by float rounding (1e-7 relative; 3e-5 for the meta-model's teacher, refitted over 300 Adam steps), while
a resume that loses state (weights, optimizer moments, a method's set-up) moves it by far more."""

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fdlit.cli import main
from fdlit.configuration.former_names import RENAMED, current_name, current_spelling, former_spellings, translated
from fdlit.reporting import method_label
from fdlit.runs import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
LEGACY = Path(__file__).resolve().parent / "legacy_runs"
SUWA_OLD, SUWA = "fdlit.aggregators.SmoothedUncertaintyWeightedAggregator", "fdlit.methods.SmoothedUncertaintyWeighted"
TINY = ["--logger.mode", "disabled", "--logger.progress", "false", "--federation.rounds", "1",
        "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
        "--data.num_clients", "5", "--data.public_size", "60"]

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


def resumes_to_the_uninterrupted_numbers(run: Path) -> None:
    assert main(["fit", "--resume", str(run), "--federation.rounds", "2"]) == 0
    assert close(without_time(read_jsonl(run / "metrics.jsonl")), without_time(
        read_jsonl(run / "expected_metrics.jsonl")))
    assert read_jsonl(run / "communication.jsonl") == read_jsonl(run / "expected_communication.jsonl")


@pytest.mark.parametrize("name", ["digits", "digits_scaffold", "digits_meta_model"])
def test_a_run_written_before_the_rename_resumes_under_the_current_names(name, tmp_path, capsys):
    run = tmp_path / name
    shutil.copytree(LEGACY / name, run)
    old = yaml.safe_load((run / "config.yaml").read_text())["aggregator"]["class_path"]
    assert old.startswith("fdlit.aggregators.")  # really written with the former names
    resumes_to_the_uninterrupted_numbers(run)
    new = yaml.safe_load((run / "config.yaml").read_text())["aggregator"]["class_path"]
    assert new == current_name(old) and new.startswith("fdlit.methods.")  # the run now names the class as it is
    assert f"the run's aggregator.class_path {old} was renamed; it continues as {new}" in capsys.readouterr().err


def test_a_run_whose_config_was_rewritten_before_its_next_checkpoint_still_resumes(tmp_path):
    # killed after the resumed run wrote config.yaml in current names, before it saved round 2: the
    # checkpoint still fingerprints the config in former names
    run = tmp_path / "digits"
    shutil.copytree(LEGACY / "digits", run)
    config, changed = translated(yaml.safe_load((run / "config.yaml").read_text()))
    assert changed == {"aggregator.class_path": (SUWA_OLD, SUWA)}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    resumes_to_the_uninterrupted_numbers(run)


def test_a_model_of_a_run_written_before_the_rename_exports_as_it_was_saved(tmp_path, capsys):
    run = tmp_path / "digits"
    shutil.copytree(LEGACY / "digits", run)
    before = (run / "config.yaml").read_text()
    out = tmp_path / "client1.pt"
    assert main(["export", str(run), "--client", "1", "--out", str(out), "--format", "state_dict"]) == 0
    assert "client 1 after round 1" in capsys.readouterr().out
    saved = torch.load(out, weights_only=True)
    assert saved["source"]["model"] == "client 1" and saved["class_path"] == "fdlit.models.digits.MLP"
    assert (run / "config.yaml").read_text() == before  # export reads the run, never rewrites it


def test_the_real_entry_point_refuses_a_config_file_with_a_former_class_path_in_one_line(tmp_path):
    config = tmp_path / "old.yaml"
    config.write_text(f"config: {ROOT / 'configs' / 'digits.yaml'}\naggregator:\n  class_path: {SUWA_OLD}\n"
                      "  init_args:\n    tau: 0.5\n")
    out = subprocess.run([sys.executable, "-m", "fdlit", "fit", "--config", str(config), "--logger.run_dir",
                          str(tmp_path / "runs")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip() == f"fdlit: error: aggregator.class_path: {SUWA_OLD} was renamed; write {SUWA}"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flags, field, old, new", [
    (["--aggregator", "fdlit.aggregators.ProbabilityAveragingAggregator"], "aggregator",
     "fdlit.aggregators.ProbabilityAveragingAggregator", "fdlit.methods.ProbabilityAveraging"),
    (["--aggregator.class_path=fdlit.methods.MetaModelAggregator"], "aggregator.class_path",
     "fdlit.methods.MetaModelAggregator", "fdlit.methods.MetaModel"),
    (["--aggregator", "LKDAggregator"], "aggregator", "LKDAggregator", "LKD"),
    (["--aggregator", "{class_path: fdlit.aggregators.fedavg.FedAvg}"], "aggregator.class_path",
     "fdlit.aggregators.fedavg.FedAvg", "fdlit.methods.fedavg.FedAvg"),
    (["--federation.client_class", "fdlit.methods.fedmd_client.FedMDClient"], "federation.client_class",
     "fdlit.methods.fedmd_client.FedMDClient", "fdlit.clients.ClientModule"),
])
def test_a_flag_naming_a_former_class_is_refused_with_the_current_name(flags, field, old, new, tmp_path, capsys):
    argv = ["fit", "--config", "configs/digits.yaml", *flags, *TINY, "--logger.run_dir", str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"fdlit: error: {field}: {old} was renamed; write {new}"
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_naming_a_former_class_is_refused_before_any_run(tmp_path, capsys):
    sweep = tmp_path / "old.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "old", "method": "grid",
        "parameters": {"aggregator": {"values": ["fdlit.methods.ProbabilityAveraging", SUWA_OLD]}},
        "command": ["${interpreter}", "-m", "fdlit", "fit", "--config", "digits.yaml", *TINY,
                    f"--logger.run_dir={tmp_path / 'runs'}", "${args}"]}))
    assert main(["sweep", str(sweep)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"aggregator: {SUWA_OLD} was renamed; write {SUWA}")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("metrics.jsonl"))


def test_no_former_name_imports():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("fdlit.aggregators")
    import fdlit.methods

    for old in RENAMED:
        assert not hasattr(fdlit.methods, old)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("fdlit.methods.fedmd_client")


def test_the_table_translates_fdlits_former_names_only():
    assert current_name(SUWA_OLD) == SUWA
    assert current_name("fdlit.aggregators.fedavg.FedAvg") == "fdlit.methods.fedavg.FedAvg"
    assert current_name("fdlit.methods.uncertainty.SmoothedUncertaintyWeightedAggregator") == (
        "fdlit.methods.uncertainty.SmoothedUncertaintyWeighted")
    for current in (SUWA, "fdlit.methods.FedAvg", "mypkg.MetaModelAggregator", "fdlit.models.MLP"):
        assert current_name(current) is None  # current, or not fdlit's: left alone
    assert set(former_spellings(SUWA)) == {SUWA_OLD, "fdlit.aggregators.SmoothedUncertaintyWeighted",
                                           "fdlit.methods.SmoothedUncertaintyWeightedAggregator"}
    assert former_spellings("mypkg.Median") == []


def test_reports_label_runs_by_current_names_whatever_path_they_were_written_with():
    assert current_spelling("mypkg.MedianAggregator") == "mypkg.MedianAggregator"  # not ours: unchanged
    for path in (SUWA_OLD, SUWA):
        config = {"aggregator": {"class_path": path, "init_args": {"tau": 0.5}}}
        assert method_label(config) == "sUWA τ=0.5"
    for path in ("fdlit.aggregators.ProbabilityAveragingAggregator", "fdlit.methods.ProbabilityAveraging"):
        assert method_label({"aggregator": {"class_path": path}}) == "AVG"
