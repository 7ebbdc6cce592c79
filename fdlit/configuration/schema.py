"""The ``fit`` config schema: every constructor argument of the configured classes is a dotted flag
and a YAML key (jsonargparse); aggregators, models and executors are chosen with ``class_path`` /
``init_args``. Parsing only: :mod:`fdlit.runs.experiment` builds a run from the parsed config.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import re
import sys
import typing
from pathlib import Path

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, get_loader, set_loader

from fdlit.adversaries import Adversaries
from fdlit.clients import ClientOptimization
from fdlit.clients.lightning_habits import command_hint, flag_hint
from fdlit.configuration.bounded_yaml import check_arguments, check_text
from fdlit.configuration.code_allowlist import FILE_OPTIONS, CodeAllowlist, check_config_files
from fdlit.configuration.files import key_line, listed_file, read_yaml, shipped_configs  # noqa: F401 (re-exported)
from fdlit.configuration.former_names import refuse_former_names_in_arguments
from fdlit.configuration.run_settings import CheckpointConfig, LoggerConfig
from fdlit.data import FederatedData
from fdlit.errors import ConfigError, UnknownConfigKey, import_hint
from fdlit.federation.server import ServerModel
from fdlit.federation.settings import FederationSettings
from fdlit.methods import Aggregator
from fdlit.models import ClientNetwork
from fdlit.models.text import BertClassifier  # noqa: F401 (lazy in fdlit.models; imported here so help lists it)
from fdlit.privacy import UploadPrivacy

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the fdlit package
CONFIG_DIRS = (Path.cwd() / "configs", PACKAGE_ROOT.parent / "configs")


def resolve_config_path(value: str) -> str:
    """``--config cifar100.yaml`` or ``--config cifar100`` finds ``configs/cifar100.yaml``, and
    ``--config methods/feddf`` finds ``configs/methods/feddf.yaml``."""
    path = Path(value)
    if path.exists():
        return value
    if path.is_symlink():  # a link to itself, a loop or a target that is gone: not "no such file"
        raise ConfigError("config", f"{value!r} is a link that leads to no file (a loop of links or a missing target)")
    names = [value] if value.endswith((".yaml", ".yml")) else [value, value + ".yaml"]
    for folder in CONFIG_DIRS:
        for name in names:
            if (folder / name).exists():
                return str(folder / name)
    shipped = sorted({p.name for folder in CONFIG_DIRS if folder.exists() for p in folder.glob("*.yaml")})
    layers = sorted({p.parent.name for folder in CONFIG_DIRS if folder.exists() for p in folder.glob("*/*.yaml")})
    raise ConfigError("config", f"no config file {value!r}; shipped configs: {', '.join(shipped) or 'none'}"
                      + (f"; parts to stack in {', '.join(f'{d}/' for d in layers)}" if layers else ""))


def _load_without_layers(text: str):
    """jsonargparse's YAML loading, less a document's top-level ``config:`` list: fdlit expands it itself
    (``rewrite_config_args``), finding parts beside the file or in fdlit's configs/, where jsonargparse
    would look for a single name beside the file only. Text beyond fdlit's bounds (a value on the command
    line as well as a file: an alias bomb, a 100,000-deep list) is refused before it is loaded."""
    check_text(text)
    value = YAML_LOADER(text)
    if isinstance(value, dict):
        value.pop("config", None)
    return value


YAML_LOADER = get_loader("yaml")
PARSER_MODE = "fdlit_yaml"  # the fit parser's mode (``parser_mode``); the top-level parser passes it on
set_loader(PARSER_MODE, _load_without_layers, exceptions=(yaml.YAMLError,))


def fit_parser() -> ArgumentParser:
    parser = ArgumentParser(parser_mode=PARSER_MODE, description="Run one federated-distillation experiment. Continue a killed run with "
                            "`fdlit fit --resume RUN_DIR` (config and seed come from RUN_DIR).", env_prefix="FDLIT",
                            default_env=False, allow_abbrev=False)  # --data.num_client must not mean num_clients
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file (path, or a name in configs/)")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the partition, models and batch order.")
    parser.add_class_arguments(FederatedData, "data")
    parser.add_subclass_arguments(
        ClientNetwork, "model", instantiate=False, required=False,
        default={"class_path": "fdlit.models.SmallCNN"},
        help="Client network (class_path/init_args); input_shape and num_classes come from the data. Any "
             "torch.nn.Module subclass whose constructor takes input_shape and num_classes works by class_path.",
    )
    parser.add_class_arguments(ClientOptimization, "client")
    parser.add_subclass_arguments(
        Aggregator, "aggregator", required=False,
        default={"class_path": "fdlit.methods.SmoothedUncertaintyWeighted"},
        help="Aggregation rule (class_path/init_args), e.g. fdlit.methods.ProbabilityAveraging.",
    )
    parser.add_class_arguments(FederationSettings, "federation", instantiate=False)
    parser.add_class_arguments(UploadPrivacy, "privacy")
    parser.add_class_arguments(Adversaries, "adversaries")
    parser.add_class_arguments(ServerModel, "server", skip={"model"}, instantiate=False)
    parser.add_subclass_arguments(
        ClientNetwork, "server.model", instantiate=False, required=False, default=None,
        help="Server model (class_path/init_args), distilled from the aggregated teacher each round; "
             "null (default): none. input_shape and num_classes come from the data.",
    )
    parser.add_class_arguments(LoggerConfig, "logger")
    parser.add_class_arguments(CheckpointConfig, "checkpoint")
    return parser


def config_layers(path: str, _including: tuple[Path, ...] = ()) -> list[str]:
    """The files a config file stands for, in the order they apply: the files its top-level ``config:``
    key names (one path or a list, relative to the file, each expanded the same way), then the file itself.
    jsonargparse reads a single ``config: other.yaml`` but silently drops a list, hence this expansion."""
    file = Path(path).resolve()
    if file in _including:
        chain = " -> ".join(str(p) for p in (*_including, file))
        raise ConfigError("config", f"{path} includes itself ({chain})")
    # strict: UTF-8, YAML, no key twice, not empty; one line naming the file and line otherwise
    data = read_yaml(path, "config")
    listed = data.get("config") if isinstance(data, dict) else None
    if listed is None:
        return [path]
    entries = [listed] if isinstance(listed, str) else listed
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ConfigError("config", f"{path}: `config:` must be a file name or a list of file names, got {listed!r}")
    layers: list[str] = []
    for entry in entries:
        layers += config_layers(str(listed_file(path, entry)), (*_including, file))
    return [*layers, path]


def rewrite_config_args(argv: list[str]) -> list[str]:
    """Every ``--config X``: X resolved to a file (a bare name finds ``configs/X.yaml``) and preceded by
    the files it lists under ``config:``. Applying it twice gives the same arguments."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        elif arg.startswith("--config="):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        *listed, file = config_layers(resolve_config_path(value))
        flags = [part for layer in listed for part in ("--config", layer)]
        if flags and out[-len(flags):] == flags:  # already expanded
            flags = []
        out += [*flags, "--config", file]
    out = attach_signed_numbers(out)
    check_arguments(out, FILE_OPTIONS)  # a section given as a file or as text: within a config file's bounds
    refuse_former_names_in_arguments(out)  # a former class name: refused with the current one
    return out


def attach_signed_numbers(argv: list[str]) -> list[str]:
    """``--aggregator.tau -inf`` as ``--aggregator.tau=-inf``: argparse takes a value starting with ``-``
    that is not a plain negative number (``-inf``, ``-1e3``) for an option, and would refuse the flag as
    missing its value instead of checking the value."""
    out = list(argv)
    for i in range(len(out) - 1):
        flag, value = out[i], out[i + 1]
        if flag is None or value is None:
            continue
        if flag.startswith("--") and "=" not in flag and value.startswith("-") and _is_number(value):
            out[i], out[i + 1] = f"{flag}={value}", None
    return [a for a in out if a is not None]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def config_files(argv: list[str]) -> list[str]:
    """The files of every ``--config`` in (already rewritten) arguments, in the order they apply."""
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    return files + [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]


def _close(word: str, candidates, n: int = 1, cutoff: float = 0.8) -> list[str]:
    """The nearest of ``candidates``; 0.8 as for a misspelt flag (--data.num_client)."""
    return difflib.get_close_matches(word, sorted(set(candidates)), n=n, cutoff=cutoff)


def _unknown_key(dotted: str, parser: ArgumentParser, files: list[str], command: str,
                 leaf_candidates: list[str] | None = None) -> ConfigError | None:
    """A key no option has, located in the config file that holds it, with the nearest option; None
    when no file holds it (the caller words it without a place)."""
    options = [o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--")]
    parts = dotted.split(".")
    # the line of the first level no option has: `federaton:`'s, not that of the `rounds:` under it
    wrong = len(parts) if leaf_candidates is not None else next(
        (i for i in range(1, len(parts) + 1)
         if not any(o == ".".join(parts[:i]) or o.startswith(".".join(parts[:i]) + ".") for o in options)), len(parts))
    for file in files:
        if key_line(file, dotted) is None:
            continue
        line = key_line(file, ".".join(parts[:wrong]))
        if leaf_candidates is None:
            near = _close(dotted, [o for o in options if o.count(".") == dotted.count(".")])
        else:  # an init argument of a class_path: the class's own arguments
            prefix, _, leaf = dotted.rpartition(".")
            near = [f"{prefix}.{c}" for c in _close(leaf, leaf_candidates, cutoff=0.6)]  # few names: `tua` is `tau`
        hint = f"did you mean {near[0]}?" if near else f"`fdlit {command} --help` lists every option"
        return UnknownConfigKey(dotted, f"no such option ({hint})", file, line)
    return None


def _init_parameters(class_path: str) -> list[str] | None:
    """The constructor arguments of the class at ``class_path`` (None when it does not import)."""
    cls = _import_class(class_path)
    if cls is None:
        return None
    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _import_class(class_path: str):
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError, ValueError):
        return None


def _class_names(base: type) -> list[str]:
    """Every imported subclass of ``base`` by the shortest module path that exports it
    (``fdlit.methods.SmoothedUncertaintyWeighted``, not the module that defines it)."""
    found, todo = [], list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        parts = cls.__module__.split(".")
        for i in range(1, len(parts) + 1):
            if getattr(sys.modules.get(".".join(parts[:i])), cls.__name__, None) is cls:
                found.append(f"{'.'.join(parts[:i])}.{cls.__name__}")
                break
    return found


def _base_classes(parser: ArgumentParser, field: str) -> list[type]:
    action = next((a for a in parser._actions if a.dest == field), None)
    todo, out = [getattr(action, "_typehint", None)], []
    while todo:
        hint = todo.pop()
        if isinstance(hint, type) and hint is not type(None):
            out.append(hint)
        else:
            todo += typing.get_args(hint)
    return out


def _unresolved_class(field: str, class_path: str, parser: ArgumentParser, files: list[str]) -> ConfigError:
    names = [n for base in _base_classes(parser, field) for n in _class_names(base)]
    # compared by class name: the shared module path would make every class look close
    near_names = _close(class_path.rpartition(".")[2], [n.rpartition(".")[2] for n in names], n=3, cutoff=0.6)
    near = [n for short in near_names for n in sorted(set(names)) if n.rpartition(".")[2] == short]
    hint = f"did you mean {' or '.join(near)}?" if near else f"`fdlit fit --help` lists fdlit's {field} classes"
    try:  # a module of the user's own that Python cannot find: say how it finds one
        importlib.import_module(class_path.rpartition(".")[0])
        where = ""
    except ImportError as exc:
        where = import_hint(str(exc))
    message = f"no class {class_path!r} ({hint}){where}"
    for file in files:
        for key in (f"{field}.class_path", field):  # `aggregator: {class_path: X}` or `aggregator: X`
            line = key_line(file, key, class_path)
            if line is not None:
                return UnknownConfigKey(key, message, file, line)
    return ConfigError(field, message)


def parse_error(exc: argparse.ArgumentError, parser: ArgumentParser, command: str = "fit",
                files: list[str] = ()) -> ConfigError:
    """A jsonargparse error as a ConfigError naming the field (and the option meant, for a typo). A key
    of one of the config ``files`` that no option has is named with its file and line."""
    text = str(exc).strip()
    files = list(files)
    keys = re.findall(r'Parser key "([^"]+)":', text)  # nested for class_path arguments: model, then hidden
    problem = re.search(r"Problem with given class_path '([^']+)':\s*(.*)", text, re.DOTALL)
    if keys and problem and _import_class(problem.group(1)) is None:
        return _unresolved_class(keys[0], problem.group(1), parser, files)
    # jsonargparse's words for a key no option has: in a group, in a class's arguments, or (parsed
    # through a subcommand) the whole dotted key
    unaccepted = re.search(r"Group '([^']+)' does not accept option '([^']+)'|Option '([^']+)' is not accepted"
                           r"|Subcommand '[^']+' does not accept option '([^']+)'", text)
    key = unaccepted and (unaccepted.group(2) or unaccepted.group(3) or unaccepted.group(4))
    if key and key not in ("class_path", "init_args"):  # those two: a mix-up of classes, in jsonargparse's words
        if keys and problem:  # an argument of the class at class_path
            dotted, leaves = f"{keys[0]}.init_args.{key}", _init_parameters(problem.group(1))
        else:
            dotted, leaves = f"{unaccepted.group(1)}.{key}" if unaccepted.group(1) else key, None
        located = _unknown_key(dotted, parser, files, command, leaves)
        if located is not None:
            return located
    unknown = re.match(r"unrecognized arguments: (\S+)", text, re.IGNORECASE)
    if unknown:
        flag = unknown.group(1).split("=", 1)[0]
        lightning = flag_hint(flag)  # --trainer.max_epochs, --ckpt_path: a Lightning habit
        if lightning:
            return ConfigError(flag.lstrip("-"), f"no such option; {lightning}")
        options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
        close = difflib.get_close_matches(flag, options, n=1, cutoff=0.8)
        hint = f"did you mean {close[0]}? " if close else ""
        return ConfigError(flag.lstrip("-"), f"no such option ({hint}`fdlit {command} --help` lists every option)")
    group = re.search(r"Group '([^']+)' does not accept option '([^']+)'", text)
    if group:  # a key in a config file that does not exist, and not found in the files given
        return ConfigError(f"{group.group(1)}.{group.group(2)}",
                           f"no such key (`fdlit {command} --help` lists every option)")
    scalar = re.search(r"Unable to load config '([^']*)'", text)
    if keys and scalar:  # a whole section given a plain value: `--federation 5`
        return ConfigError(keys[0], f"a section takes a YAML mapping, a YAML file of one, or its keys as dotted "
                                    f"options (e.g. --{keys[0]}.<key> value); got {scalar.group(1)!r}")
    if text.startswith("Problems parsing config"):
        return ConfigError("config", " ".join(text.split()))
    choice = re.match(r"argument command: invalid choice: (\S+)", text)
    if choice:
        commands = list(getattr(parser._subcommands_action, "choices", None) or ["fit", "sweep", "report"])
        instead = command_hint(choice.group(1))  # validate, test, predict: Lightning CLI's subcommands
        return ConfigError("command", f"allowed: {', '.join(commands)}; got {choice.group(1)}"
                           + (f" ({instead})" if instead else ""))
    if "subclass of ClientNetwork" in text:  # model or server.model named a class fdlit cannot build
        field = "server.model" if re.search(r'^\W*(Parser key ")?server\.model\b', text) else "model"
        named = re.search(r"Import path (\S+) does not|but (\S+) either not accessible", text)
        what = next((g for g in named.groups() if g), "the class") if named else "the class"
        return ConfigError(field, f"{what} is not a network fdlit can build: it needs a torch.nn.Module "
                           "subclass whose constructor takes input_shape and num_classes (`fdlit fit --help` lists "
                           "fdlit's)")
    literal = re.search(r"Expected a typing\.Literal\[([^\]]*)\]", text)
    given = re.search(r"(?:Got value|Given value): (.*)$", text, re.MULTILINE)
    if keys and literal and given:  # a choice field (data.class_assignment, ...) given a value it does not have
        allowed = literal.group(1) + (", null" if "NoneType" in text else "")
        return ConfigError(".".join(keys), f"allowed: {allowed}; got {given.group(1).strip()!r}")
    typed = _type_error(text)
    if keys and typed:  # a text (or list) where a number, a flag or a list of them goes
        return ConfigError(".".join(keys), typed)
    detail = " ".join(line.strip() for line in re.sub(r'Parser key "[^"]+":', "", text).splitlines() if line.strip())
    return ConfigError(".".join(keys) if keys else command, detail + import_hint(text))


# jsonargparse's names of the types whose values YAML writes plainly, as an error says what is allowed
KINDS = {"<class 'int'>": "an integer", "<class 'float'>": "a number", "<class 'bool'>": "true or false",
         "list[int]": "a list of integers", "list[float]": "a list of numbers", "<class 'NoneType'>": "null"}


def _type_error(text: str) -> str | None:
    """``allowed: an integer; got 'three'`` for jsonargparse's refusal of a value of the wrong type
    in a field of a plain type (or a union of them with null); None for any other error. A quoted
    number is not refused: it is read as the number, as every value on the command line is."""
    union = re.search(r"Subtypes: \[(.*)\]", text)
    kinds = (union.group(1).split(", ") if union else
             re.findall(r"Expected a (<class '\w+'>)\. Got value", text)[:1])
    value = re.search(r"Given value: (.*)$", text, re.MULTILINE) or re.search(r"Got value: ?(.*)$", text, re.MULTILINE)
    if not kinds or value is None or not all(k in KINDS for k in kinds):
        return None
    got = value.group(1).strip()
    bare = got.lower().strip("'\"").lstrip("+-.")
    note = " (nan is not allowed)" if bare == "nan" else " (infinity is not allowed)" if bare in ("inf", "infinity") \
        else ""
    return f"allowed: {' or '.join(KINDS[k] for k in kinds)}{note}; got {got if got.startswith('[') else repr(got)}"


def parse_fit(argv: list[str], allowlist: CodeAllowlist | None = None) -> tuple[ArgumentParser, Namespace]:
    """Parse ``fit`` arguments (without the subcommand word), resolving bare config names; a parse
    error is a ConfigError naming the field. ``allowlist``: the code the config files may name, for a
    config someone else wrote (a node's, a run folder's); checked before anything is imported."""
    argv = rewrite_config_args(argv)
    check_config_files(config_files(argv), allowlist)  # sections are mappings; no code outside the allow-list
    parser = fit_parser()
    parser.exit_on_error = False
    try:
        return parser, parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        raise parse_error(exc, parser, files=config_files(argv)) from None
