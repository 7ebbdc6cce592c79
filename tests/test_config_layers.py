"""Configs that compose: a file's top-level ``config:`` list is expanded into one ``--config`` per listed
file (relative to the file, recursively) before the file itself, and the shipped layers
(configs/datasets, configs/methods, configs/studies) stack on the command line to the shipped one-file
configs."""

import shutil
from pathlib import Path

import pytest
import yaml

import fdlit.configuration.files
import fdlit.configuration.schema
from fdlit.configuration.schema import config_layers, parse_fit, rewrite_config_args
from fdlit.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
METHODS = sorted(p.stem for p in (CONFIGS / "methods").glob("*.yaml"))
STUDIES = sorted(p.stem for p in (CONFIGS / "studies").glob("*.yaml"))


def plain(cfg) -> dict:
    d = cfg.clone().as_dict()
    d.pop("config", None)  # the files read, not a setting
    return d


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def layered(tmp_path):
    """top.yaml lists parts/data.yaml (which itself lists base.yaml, relative to parts/) and parts/lr.yaml."""
    write(tmp_path / "parts" / "base.yaml", "seed: 1\nclient:\n  lr: 0.1\n  batch_size: 7\n")
    write(tmp_path / "parts" / "data.yaml", "config: [base.yaml]\ndata:\n  num_clients: 6\nseed: 2\n")
    write(tmp_path / "parts" / "lr.yaml", "client:\n  lr: 0.2\n")
    return write(tmp_path / "top.yaml", "config: [parts/data.yaml, parts/lr.yaml]\nclient:\n  batch_size: 9\n")


def test_a_list_expands_in_order_recursively_and_relative_to_each_file(layered):
    parts = layered.parent / "parts"
    assert config_layers(str(layered)) == [str(parts / "base.yaml"), str(parts / "data.yaml"),
                                           str(parts / "lr.yaml"), str(layered)]
    _, cfg = parse_fit(["--config", str(layered)])
    # later layers override earlier ones, the file's own keys override its list
    assert (cfg.seed, cfg.data.num_clients, cfg.client.lr, cfg.client.batch_size) == (2, 6, 0.2, 9)


def test_the_command_line_overrides_the_layers(layered):
    _, cfg = parse_fit(["--config", str(layered), "--client.lr", "0.3", "--seed", "5"])
    assert (cfg.seed, cfg.client.lr, cfg.client.batch_size) == (5, 0.3, 9)


def test_a_single_name_is_a_one_element_list(tmp_path):
    write(tmp_path / "base.yaml", "client:\n  lr: 0.4\n")
    top = write(tmp_path / "top.yaml", "config: base.yaml\nseed: 3\n")
    assert config_layers(str(top)) == [str(tmp_path / "base.yaml"), str(top)]
    _, cfg = parse_fit(["--config", str(top)])
    assert (cfg.seed, cfg.client.lr) == (3, 0.4)


def test_expanding_twice_changes_nothing(layered):
    once = rewrite_config_args(["--config", str(layered), "--seed", "4"])
    assert once.count("--config") == 4
    assert rewrite_config_args(once) == once
    assert rewrite_config_args([f"--config={layered}"]) == once[:-2]


def test_a_missing_listed_file_names_the_file_and_the_entry(tmp_path):
    top = write(tmp_path / "top.yaml", "config: [nosuch.yaml]\nseed: 1\n")
    with pytest.raises(ConfigError) as err:
        parse_fit(["--config", str(top)])
    assert err.value.field == "config" and str(top) in str(err.value) and "'nosuch.yaml'" in str(err.value)


def test_a_cycle_and_a_malformed_list_are_config_errors(tmp_path):
    write(tmp_path / "a.yaml", "config: [b.yaml]\n")
    write(tmp_path / "b.yaml", "config: [a.yaml]\n")
    with pytest.raises(ConfigError, match="includes itself"):
        parse_fit(["--config", str(tmp_path / "a.yaml")])
    write(tmp_path / "c.yaml", "config: {data: 3}\n")
    with pytest.raises(ConfigError, match="file name or a list of file names"):
        parse_fit(["--config", str(tmp_path / "c.yaml")])


def test_stacked_layers_equal_the_shipped_one_file_config():
    _, stacked = parse_fit(["--config", "datasets/digits.yaml", "--config", "methods/feddf.yaml"])
    _, shipped = parse_fit(["--config", "digits_feddf.yaml"])
    assert plain(stacked) == plain(shipped)
    assert stacked.aggregator.class_path == "fdlit.methods.FedDF" and stacked.client.optimizer == "sgd"
    assert stacked.data.num_clients == 20 and stacked.federation.public_epochs == 0


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("digits*.yaml")), ids=lambda p: p.name)
def test_every_shipped_digits_config_is_its_listed_layers(path):
    listed = yaml.safe_load(path.read_text())["config"]
    assert listed[0] == "datasets/digits.yaml"
    _, stacked = parse_fit([part for name in listed for part in ("--config", name)])
    _, shipped = parse_fit(["--config", path.name])
    assert plain(stacked) == plain(shipped)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_stacks_on_the_digits_federation(method):
    _, base = parse_fit(["--config", "datasets/digits.yaml"])
    _, cfg = parse_fit(["--config", "datasets/digits.yaml", "--config", f"methods/{method}"])
    declared = yaml.safe_load((CONFIGS / "methods" / f"{method}.yaml").read_text())
    if "aggregator" in declared:
        assert cfg.aggregator.class_path == declared["aggregator"]["class_path"]
    else:  # a baseline mode (local-only): no aggregator of its own, the mode is what it sets
        assert cfg.federation.mode == declared["federation"]["mode"] != base.federation.mode
    assert cfg.data == base.data and cfg.model == base.model  # a method leaves the federation alone
    if "aggregator" not in declared:
        return  # stacked on a full config it keeps that config's (unused) aggregator
    _, over_default = parse_fit(["--config", "digits.yaml", "--config", f"methods/{method}"])
    assert plain(over_default) == plain(cfg)  # stacked on a full config, a method replaces its method


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_stacks_on_a_method(study):
    _, without = parse_fit(["--config", "datasets/digits.yaml", "--config", "methods/avg"])
    _, cfg = parse_fit(["--config", "datasets/digits.yaml", "--config", "methods/avg", "--config", f"studies/{study}"])
    assert plain(cfg) != plain(without) and cfg.aggregator == without.aggregator


def test_the_dumped_config_is_self_contained(tmp_path):
    """What a run directory's config.yaml holds: resolved values, no reference to the layers."""
    parser, cfg = parse_fit(["--config", "digits_feddf.yaml"])
    saved = write(tmp_path / "config.yaml", parser.dump(cfg, skip_unset=False))
    dumped = yaml.safe_load(saved.read_text())
    assert "config" not in dumped and dumped["aggregator"]["class_path"] == "fdlit.methods.FedDF"
    _, again = parse_fit(["--config", str(saved)])
    assert plain(again) == plain(cfg)


def test_a_copied_config_finds_its_parts_in_fdlits_configs(tmp_path, monkeypatch):
    """configs/digits.yaml copied alone elsewhere: its parts (datasets/digits.yaml, methods/suwa.yaml) are
    fdlit's shipped ones, whatever the working directory."""
    copy = tmp_path / "mine" / "digits.yaml"
    copy.parent.mkdir()
    shutil.copy(CONFIGS / "digits.yaml", copy)
    monkeypatch.chdir(tmp_path)
    assert config_layers(str(copy)) == [str(CONFIGS / "datasets" / "digits.yaml"),
                                        str(CONFIGS / "methods" / "suwa.yaml"), str(copy)]
    _, cfg = parse_fit(["--config", str(copy)])
    _, shipped = parse_fit(["--config", str(CONFIGS / "digits.yaml")])
    assert plain(cfg) == plain(shipped) and cfg.data.num_clients == 20


def test_a_part_beside_the_copy_wins_over_the_shipped_one(tmp_path, monkeypatch):
    for part in ("digits.yaml", "datasets/digits.yaml", "methods/suwa.yaml"):
        write(tmp_path / part, (CONFIGS / part).read_text())
    local = tmp_path / "datasets" / "digits.yaml"
    local.write_text(local.read_text().replace("num_clients: 20", "num_clients: 10"))
    monkeypatch.chdir(tmp_path)
    assert config_layers(str(tmp_path / "digits.yaml"))[0] == str(local)
    _, cfg = parse_fit(["--config", str(tmp_path / "digits.yaml")])
    assert cfg.data.num_clients == 10 and cfg.aggregator.init_args.tau == 0.25


def test_a_single_listed_name_found_only_in_fdlits_configs(tmp_path, monkeypatch):
    top = write(tmp_path / "top.yaml", "config: datasets/digits.yaml\nseed: 4\n")
    monkeypatch.chdir(tmp_path)
    _, cfg = parse_fit(["--config", str(top)])
    assert (cfg.seed, cfg.data.num_clients, cfg.model.class_path) == (4, 20, "fdlit.models.MLP")


def test_a_part_found_nowhere_says_where_it_looked_and_an_install_without_configs_says_so(tmp_path, monkeypatch):
    top = write(tmp_path / "top.yaml", "config: [datasets/nosuch.yaml]\n")
    with pytest.raises(ConfigError) as err:
        parse_fit(["--config", str(top)])
    assert str(tmp_path / "datasets" / "nosuch.yaml") in str(err.value)
    assert str(CONFIGS / "datasets" / "nosuch.yaml") in str(err.value)
    monkeypatch.setattr(fdlit.configuration.files, "PACKAGE_ROOT", tmp_path / "site-packages" / "fdlit")  # a wheel install
    with pytest.raises(ConfigError, match="no configs/ folder.*installed as a package.*pip install -e"):
        parse_fit(["--config", str(top)])
