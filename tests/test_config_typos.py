"""A misspelt key in a config file is named with its file, its line and the nearest option; a class_path
that does not resolve with the nearest classes of its kind. Through the real entry point, fdlit.cli.main."""

from pathlib import Path

import pytest

from fdlit.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def run(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(["fit", *argv, "--print_config"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


TYPOS = [
    ("config: [datasets/digits.yaml]\nseed: 1\ndata:\n  dataset: digits\n  num_client: 5\n", 5,
     "data.num_client", "data.num_clients"),
    ("seed: 1\nfederaton:\n  rounds: 2\n", 2, "federaton.rounds", "federation.rounds"),
    ("seeed: 3\n", 1, "seeed", "seed"),
    ("federation:\n  rounds: 2\n  participation:\n    fractin: 0.5\n", 4, "federation.participation.fractin",
     "federation.participation.fraction"),
    ("aggregator:\n  class_path: fdlit.methods.SmoothedUncertaintyWeighted\n  init_args:\n    tauu: 0.3\n", 4,
     "aggregator.init_args.tauu", "aggregator.init_args.tau"),
    ("model:\n  class_path: fdlit.models.MLP\n  init_args:\n    hiden: [16]\n", 4, "model.init_args.hiden",
     "model.init_args.hidden"),
]


@pytest.mark.parametrize("text,line,key,nearest", TYPOS)
def test_a_misspelt_key_names_file_line_and_nearest_option(tmp_path, capsys, text, line, key, nearest):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    err = run(capsys, "--config", str(path))
    assert err == f"fdlit: error: {path}:{line}: {key}: no such option (did you mean {nearest}?)"


@pytest.mark.parametrize("text,line,key,nearest", TYPOS)
def test_fit_locates_the_typo_without_print_config(tmp_path, capsys, text, line, key, nearest):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    capsys.readouterr()
    assert main(["fit", "--config", str(path), "--logger.mode", "disabled", "--logger.run_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fdlit: error: {path}:{line}: {key}: no such option (did you mean {nearest}?)"
    assert not any(tmp_path.iterdir()) or [p.name for p in tmp_path.iterdir()] == ["mine.yaml"]  # nothing started


@pytest.mark.parametrize("command", ["deploy", "sweep"])
@pytest.mark.parametrize("text,line,key,nearest", [TYPOS[0], TYPOS[4]])
def test_deploy_and_sweep_locate_the_typo(tmp_path, capsys, command, text, line, key, nearest):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    if command == "deploy":
        argv = ["deploy", "--config", str(path), "--logger.mode", "disabled"]
    else:
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text("name: typo\nmethod: grid\nparameters:\n  seed:\n    values: [0, 1]\nprogram: fdlit/__main__.py\n"
                         "command: ['${env}', '${interpreter}', -m, fdlit, fit, --config, " + f"'{path}', " + "'${args}']\n")
        argv = ["sweep", str(sweep), "--", "--logger.mode", "disabled", "--logger.run_dir", str(tmp_path / "runs")]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{path}:{line}: {key}: no such option (did you mean {nearest}?)"), err
    assert len(err.splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_jsonargparse_is_in_its_tested_range_and_an_unknown_wording_still_gives_one_line():
    """The rewriting reads jsonargparse's wording: the installed version is inside pyproject's range,
    whose lower end `make compat` tests; there is no upper bound, because an error worded in a way the
    rewriting does not know still becomes one `fdlit: error:` line, in jsonargparse's own words."""
    import argparse
    import re
    from importlib.metadata import version

    from packaging.requirements import Requirement

    from fdlit.configuration.schema import fit_parser, parse_error

    pyproject = (CONFIGS.parent / "pyproject.toml").read_text()
    (spec,) = [Requirement(d).specifier for d in re.findall(r'"(jsonargparse[^"]*)"', pyproject)]
    assert version("jsonargparse") in spec
    assert [s.operator for s in spec] == [">="]
    error = parse_error(argparse.ArgumentError(None, "Some wording\n  of a future release"), fit_parser())
    assert str(error) == "fit: Some wording of a future release"


def test_the_misspelt_key_is_found_in_the_layer_that_holds_it(tmp_path, capsys):
    (tmp_path / "part.yaml").write_text("client:\n  lr: 0.1\n  batchsize: 8\n")
    top = tmp_path / "top.yaml"
    top.write_text("config: [part.yaml]\nseed: 2\n")
    err = run(capsys, "--config", str(top))
    assert err == (f"fdlit: error: {tmp_path / 'part.yaml'}:3: client.batchsize: no such option "
                   "(did you mean client.batch_size?)")


def test_a_key_nothing_resembles_still_gets_file_and_line(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("seed: 0\ndata:\n  zzzz: 1\n")
    assert run(capsys, "--config", str(path)).startswith(f"fdlit: error: {path}:3: data.zzzz: no such option (`fdlit fit")


def test_a_class_path_that_does_not_resolve_lists_the_nearest_of_its_kind(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("seed: 0\naggregator:\n  class_path: fdlit.methods.SmoothedUncertainty\n")
    assert run(capsys, "--config", str(path)) == (
        f"fdlit: error: {path}:3: aggregator.class_path: no class 'fdlit.methods.SmoothedUncertainty' "
        "(did you mean fdlit.methods.SmoothedUncertaintyWeighted?)")
    path.write_text("server:\n  model:\n    class_path: fdlit.models.MPL\n")
    assert run(capsys, "--config", str(path)) == (
        f"fdlit: error: {path}:3: server.model.class_path: no class 'fdlit.models.MPL' (did you mean fdlit.models.MLP?)")
    # on the command line: the same suggestion, without a place
    assert run(capsys, "--config", str(CONFIGS / "digits.yaml"), "--aggregator", "fdlit.methods.SmoothedUncertainty") == (
        "fdlit: error: aggregator: no class 'fdlit.methods.SmoothedUncertainty' "
        "(did you mean fdlit.methods.SmoothedUncertaintyWeighted?)")


def test_a_class_path_written_as_the_sections_value(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("seed: 0\n\naggregator: fdlit.methods.SmoothedUncertainty\n")
    assert run(capsys, "--config", str(path)).startswith(
        f"fdlit: error: {path}:3: aggregator: no class 'fdlit.methods.SmoothedUncertainty' (did you mean")
