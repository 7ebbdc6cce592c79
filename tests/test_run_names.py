"""Default run names say what a run changed, and are unique per setting (seeds share the setting)."""

import json
from pathlib import Path

from fdlit.cli import main


def tiny(tmp_path, *extra):
    return ["fit", "--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", "1", "--federation.private_epochs_first", "1",
            "--federation.private_epochs", "1", "--federation.public_epochs_first", "1",
            "--federation.public_epochs", "1", "--data.num_clients", "5", "--data.public_size", "120", *extra]


def summaries(tmp_path) -> dict[str, dict]:
    out = {}
    for path in Path(tmp_path).glob("*/summary.json"):
        summary = json.loads(path.read_text())
        out[summary["run"]] = summary
    return out


def test_default_names_carry_the_changed_settings_and_differ_per_setting(tmp_path):
    variants = {"default": [], "tau": ["--aggregator.tau", "0.5"], "hidden": ["--model.init_args.hidden", "[32,16]"],
                "seed1": ["--seed", "1"], "lr": ["--client.lr", "0.01"]}
    names = {}
    for key, extra in variants.items():
        before = set(summaries(tmp_path))
        assert main(tiny(tmp_path, *extra)) == 0
        (names[key],) = set(summaries(tmp_path)) - before
    runs = summaries(tmp_path)
    assert len(set(names.values())) == len(variants)  # no two settings share a name
    assert names["default"].startswith("suwa-k2-digits-") and names["default"].endswith("-seed0")
    assert names["tau"].startswith("suwa-tau0.5-k2-digits-")
    assert "-hidden32x16-" in names["hidden"]
    # a seed is the same setting: the same name but for the seed, the same setting hash
    assert names["seed1"] == names["default"].removesuffix("-seed0") + "-seed1"
    assert runs[names["seed1"]]["setting"] == runs[names["default"]]["setting"]
    # a setting the readable part leaves out still changes the hash, and the summary names it in full
    assert names["lr"] != names["default"] and runs[names["lr"]]["setting"] != runs[names["default"]]["setting"]
    assert runs[names["lr"]]["non_default_settings"]["client.lr"] == 0.01
    assert runs[names["tau"]]["non_default_settings"]["aggregator.init_args.tau"] == 0.5
    assert "client.lr" not in runs[names["default"]]["non_default_settings"]
    # the run folder is named by it too
    assert all(Path(s["run_dir"]).name.endswith(name) for name, s in runs.items())


def test_a_given_name_wins(tmp_path):
    assert main(tiny(tmp_path, "--logger.name", "mine")) == 0
    (summary,) = summaries(tmp_path).values()
    assert summary["run"] == "mine" and summary["setting"]


def test_the_wandb_config_holds_every_setting_and_the_setting_hash(tmp_path):
    import yaml

    from fdlit.configuration.run_settings import LoggerConfig
    from fdlit.runs.wandb_logger import WandbLogger

    assert main(tiny(tmp_path, "--aggregator.tau", "0.5")) == 0
    (summary,) = summaries(tmp_path).values()
    config = yaml.safe_load((Path(summary["run_dir"]) / "config.yaml").read_text())
    logger = WandbLogger(LoggerConfig(mode="disabled"), config, Path(summary["run_dir"]), summary["run"])
    assert logger.run_config["setting"] == summary["setting"] and summary["setting"] in summary["run"]
    assert logger.run_config["aggregator.tau"] == 0.5


def test_a_federation_of_mixed_networks_is_named_by_its_architectures(tmp_path):
    assert main(tiny(tmp_path, "--config", "models/digits_mixed.yaml")) == 0
    (name,) = summaries(tmp_path)
    assert name.startswith("suwa-k2-digits-MLP+SmallCNN-") and name.endswith("-seed0"), name
    assert "class_path" not in name and "init_args" not in name
