import json
import subprocess
import sys
from pathlib import Path

import pytest

from fdlit.cli import main
from fdlit.configuration.schema import parse_fit, resolve_config_path
from fdlit.runs.experiment import Experiment

REPO = Path(__file__).resolve().parents[1]


def test_bare_config_name_resolves_to_configs_folder():
    assert Path(resolve_config_path("digits.yaml")).resolve() == (REPO / "configs" / "digits.yaml").resolve()
    assert Path(resolve_config_path("digits")).resolve() == (REPO / "configs" / "digits.yaml").resolve()


def test_dotted_flags_reach_the_objects(fast_args):
    parser, cfg = parse_fit(fast_args + ["--aggregator.tau", "0.5", "--seed", "3", "--client.lr", "0.01"])
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    assert loop.server_side.method.tau == 0.5
    assert loop.seed == 3
    assert loop.optimization.lr == 0.01
    assert loop.data.classes_per_client == 3 and loop.data.num_clients == 4
    assert loop.settings.rounds == 2
    # the full resolved config is kept for W&B and the run directory
    assert experiment.config["aggregator"]["init_args"]["tau"] == 0.5
    assert "tau: 0.5" in experiment.config_yaml


def test_switching_to_uwa_does_not_inherit_suwa_tau(fast_args):
    parser, cfg = parse_fit(fast_args + ["--aggregator", "fdlit.methods.UncertaintyWeighted"])
    assert Experiment(cfg, parser).loop.server_side.method.tau == 1.0


def test_class_path_picks_aggregator_and_model(fast_args):
    parser, cfg = parse_fit(fast_args + ["--aggregator", "fdlit.methods.ProbabilityAveraging",
                                         "--model", "fdlit.models.MLP", "--model.hidden", "[32]"])
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    assert type(loop.server_side.method).__name__ == "ProbabilityAveraging"
    assert loop.model_spec["class_path"] == "fdlit.models.MLP"
    assert loop.model_spec["init_args"]["hidden"] == [32]


def run_cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "fdlit", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_print_config_and_help():
    out = run_cli("fit", "--config", "digits.yaml", "--aggregator.tau", "0.7", "--print_config")
    assert out.returncode == 0, out.stderr
    assert "tau: 0.7" in out.stdout and "classes_per_client: 2" in out.stdout
    out = run_cli("fit", "--help")
    assert out.returncode == 0
    for flag in ("--data.classes_per_client", "--federation.rounds", "--client.lr", "--logger.mode"):
        assert flag in out.stdout
    assert "k, for" in out.stdout  # knob documentation comes from the docstrings


BAD_INPUTS = [
    (["--data.classes_per_client", "0"], "data.classes_per_client"),
    (["--data.classes_per_client", "11"], "data.classes_per_client"),
    (["--aggregator.tau", "-1"], "aggregator.tau"),
    (["--aggregator", "fdlit.methods.NoSuchAggregator"], "aggregator"),
    (["--model", "fdlit.models.NoSuchNet"], "model"),
    (["--data.calibration_fraction", "1.5"], "data.calibration_fraction"),
    (["--data.calibration_fraction", "0"], "data.calibration_fraction"),
    (["--data.partition", "dirichlet", "--data.classes_per_client", "null", "--data.num_clients", "1000"],
     "data.num_clients"),
    (["--data.no_such_key", "1"], "no_such_key"),
    (["--federation.rounds", "0"], "federation.rounds"),
    (["--logger.mode", "sometimes"], "logger.mode"),
    (["--client.optimizer", "lbfgs"], "client.optimizer"),
]


@pytest.mark.parametrize("args,field", BAD_INPUTS)
def test_bad_input_fails_before_training_and_names_the_field(tmp_path, capsys, args, field):
    argv = ["fit", "--config", "digits.yaml", "--logger.mode", "disabled", "--logger.run_dir", str(tmp_path / "runs"),
            *args]
    try:
        code = main(argv)
    except SystemExit as exc:  # jsonargparse's own parse errors
        code = exc.code
    assert code == 2
    assert field in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing started


def test_unknown_config_name_lists_shipped_configs(tmp_path):
    out = run_cli("fit", "--config", "nope.yaml", cwd=tmp_path)
    assert out.returncode == 2
    assert "digits.yaml" in out.stderr


def test_main_end_to_end_two_rounds(fast_args, tmp_path, capsys):
    assert main(["fit", *fast_args]) == 0
    printed = capsys.readouterr().out
    assert "best mean global accuracy" in printed and "bytes up / down" in printed
    (run,) = list((tmp_path / "runs").iterdir())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for key in ("after_private/global_acc_mean", "after_public/local_acc_min", "teacher/acc", "weights/chi",
                "comm/up_bytes", "comm/down_bytes_total", "weights/entropy", "teacher/nll"):
        assert key in rows[-1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == 2 and 0 <= summary["best_global_acc_mean"] <= 1
    assert "classes_per_client: 3" in (run / "config.yaml").read_text()
    assert len((run / "communication.jsonl").read_text().splitlines()) > 0
