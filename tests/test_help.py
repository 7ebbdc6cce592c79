"""`fdlit fit --help`: fdlit's models and rules only, every knob described, the chosen config's values
as defaults; a model fdlit cannot build is refused at parse time, naming `model`."""

import inspect

import pytest
import torch
from jsonargparse import ArgumentParser

import fdlit.methods as aggregators
from fdlit import cli
from fdlit.methods import Aggregator
from fdlit.models import MLP, BertClassifier, ClientNetwork, LeNet5, ResNet18, SmallCNN


def _help(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(["fit", *args])
    assert exc.value.code in (0, None)
    return capsys.readouterr().out


def test_help_lists_fdlit_models_and_rules_only(capsys):
    text = " ".join(_help(capsys, "--help").split())
    for name in ("fdlit.models.MLP", "fdlit.models.SmallCNN", "fdlit.models.LeNet5", "fdlit.models.ResNet18",
                 "fdlit.models.BertClassifier", "fdlit.methods.UncertaintyWeighted"):
        assert name in text, name
    for foreign in ("torch.nn.Linear", "torch.nn.ReLU", "torchmetrics", "lightning"):
        assert foreign not in text, foreign


def _knobs(cls) -> list[tuple[str, str]]:
    parser = ArgumentParser()
    parser.add_class_arguments(cls, "x", instantiate=False)
    return [(a.dest, a.help or "") for a in parser._actions if a.dest.startswith("x.")]


RULES = [getattr(aggregators, n) for n in aggregators.__all__
         if inspect.isclass(getattr(aggregators, n)) and issubclass(getattr(aggregators, n), Aggregator)
         and not inspect.isabstract(getattr(aggregators, n))]


@pytest.mark.parametrize("cls", RULES + [MLP, SmallCNN, LeNet5, ResNet18, BertClassifier], ids=lambda c: c.__name__)
def test_every_knob_has_a_description(cls):
    knobs = _knobs(cls)
    undescribed = [dest for dest, text in knobs if not text.strip() or text.lstrip().startswith("(type:")]
    assert undescribed == [], f"{cls.__name__}: no description for {undescribed}"


def test_help_after_config_shows_the_configs_values(capsys):
    plain = _help(capsys, "--help")
    with_config = _help(capsys, "--config", "configs/digits.yaml", "--help")

    def default_of(text, flag):
        block = text.split("\n  " + flag, 1)[1].split("\n  --", 1)[0]  # the option, not the usage line
        return " ".join(block.split()).split("default: ", 1)[1].split(")")[0]

    assert default_of(plain, "--data.num_clients NUM_CLIENTS") == "10"
    assert default_of(with_config, "--data.num_clients NUM_CLIENTS") == "20"  # configs/digits.yaml
    assert default_of(with_config, "--federation.rounds ROUNDS") == "20"


@pytest.mark.parametrize("model", ["torch.nn.Linear", "torch.nn.ReLU", "fdlit.methods.UncertaintyWeighted"])
def test_a_model_fdlit_cannot_build_fails_at_parse_naming_model(tmp_path, capsys, model):
    code = cli.main(["fit", "--config", "configs/digits.yaml", "--model", model, "--logger.mode", "disabled",
                     "--logger.run_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_CONFIG
    assert "model" in err and "input_shape" in err, err
    assert not any(tmp_path.iterdir())  # nothing started


class OwnNet(torch.nn.Module):  # a plain torch.nn.Module, not derived from fdlit's base
    def __init__(self, input_shape=None, num_classes=None, width: int = 4):
        super().__init__()


def test_any_module_taking_input_shape_and_num_classes_is_accepted():
    assert issubclass(OwnNet, ClientNetwork) and issubclass(MLP, ClientNetwork)
    assert not issubclass(torch.nn.Linear, ClientNetwork)
    from fdlit.configuration.schema import parse_fit

    _, cfg = parse_fit(["--config", "configs/digits.yaml", "--model", f"{__name__}.OwnNet", "--model.width", "8"])
    assert cfg.model.class_path.endswith("OwnNet") and cfg.model.init_args.width == 8


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code in (0, None)
    text = capsys.readouterr().out
    listed = text.split("Available subcommands:", 1)[1]
    for command in ("fit", "sweep", "report", "export", "deploy", "data"):
        assert f"\n    {command} " in listed, command
    assert cli.main(["nosuch"]) == 2
    assert capsys.readouterr().err.strip() == ("fdlit: error: command: allowed: fit, sweep, report, export, deploy, "
                                               "data; got 'nosuch'")
