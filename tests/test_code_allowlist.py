"""Code a run's config names is imported only within the reader's allow-list, in every spelling:
on ``export`` of a run folder and on a deployed node (fdlit.configuration.code_allowlist)."""

from __future__ import annotations

import sys
import time

import pytest

from fdlit.cli import main
from fdlit.errors import ConfigError

EVIL = ("from pathlib import Path\nPath({touched!r}).write_text('ran')\nimport torch\n"
        "class Net(torch.nn.Module):\n    def __init__(self, **kwargs):\n        super().__init__()\n")

# name -> (the config's text, other files beside it, the key the refusal names); {here}: the config's folder
SPELLINGS = {
    "class_path": ("model:\n  class_path: evilmod.Net\n", {}, "model.class_path"),
    "client_class": ("federation:\n  client_class: evilmod.Net\n", {}, "federation.client_class"),
    "short model": ("model: evilmod.Net\n", {}, "model"),
    "short aggregator": ("aggregator: evilmod.Net\n", {}, "aggregator"),
    "short executor": ("federation:\n  executor: evilmod.Net\n", {}, "federation.executor"),
    "short callbacks": ("federation:\n  callbacks: [evilmod.Net]\n", {}, "federation.callbacks"),
    "dotted key": ("model.class_path: evilmod.Net\n", {}, "model.class_path"),
    "section file": ("model: {here}/sub/m.yaml\n", {"sub/m.yaml": "class_path: evilmod.Net\n"}, "model.class_path"),
    "config list": ("config: [{here}/part.yaml]\nseed: 0\n", {"part.yaml": "model:\n  class_path: evilmod.Net\n"},
                    "model.class_path"),
}


NAMES_A_FILE = {"section file": "model", "config list": "config"}  # spelling -> the key a node refuses


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """``evilmod.py`` importable from the working folder; importing it leaves a file behind."""
    touched = tmp_path / "evilmod-ran"
    (tmp_path / "evilmod.py").write_text(EVIL.format(touched=str(touched)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("evilmod", None)
    yield touched
    sys.modules.pop("evilmod", None)


def write_spelling(folder, name: str) -> str:
    text, files, _ = SPELLINGS[name]
    for rel, content in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(content)
    return text.replace("{here}", str(folder))


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_export_imports_no_code_outside_fdlit_in_any_spelling(name, evil, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(write_spelling(run, name))
    started = time.monotonic()
    assert main(["export", str(run), "--client", "0", "--out", str(tmp_path / "m.pt")]) == 2
    assert time.monotonic() - started < 2
    err = capsys.readouterr().err.strip().splitlines()
    key = SPELLINGS[name][2]
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: {key}: 'evilmod.Net' in ")
    assert err[0].endswith("add --trust_config")
    assert not evil.exists() and "evilmod" not in sys.modules and not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_a_node_refuses_code_its_operator_did_not_allow_in_any_spelling(name, evil, tmp_path):
    from fdlit.deployment.node import check_class_paths

    payload = write_spelling(tmp_path, name)  # the config as a node receives it at set-up
    with pytest.raises(ConfigError) as err:
        check_class_paths(payload, "torch.optim.")
    message = str(err.value)
    if name in NAMES_A_FILE:  # the server sends the config resolved: a node never reads a file it names
        assert message.startswith(f"node-config allowed-classes: the run's {NAMES_A_FILE[name]}: "), message
        assert message.endswith("names a file; a node builds the config the server sent, not files of its own "
                                "machine"), message
    else:
        assert message.startswith("node-config allowed-classes: the run names ['evilmod.Net'] "
                                  f"({SPELLINGS[name][2]} in "), message
        check_class_paths(payload, "torch.optim., evilmod.")  # allowed by the operator: accepted
    assert not evil.exists() and "evilmod" not in sys.modules  # (checking imports nothing)


@pytest.mark.parametrize("name,allowed", [("fdlit.runs.export.json.JSONDecoder", ""),  # fdlit's module, no class of it
                                          ("evilmodule.Net", "evilmod"),  # a prefix matches whole names only
                                          ("os.system", ""),
                                          ("fdlit.__main__.Net", "")])  # importing it would run the CLI
def test_the_allowlist_is_exact(name, allowed, evil):
    from fdlit.deployment.node import check_class_paths

    with pytest.raises(ConfigError, match="node-config allowed-classes: the run names"):
        check_class_paths(f"aggregator: {name}\n", allowed)


def test_fdlit_classes_and_bare_names_are_allowed(evil):
    from fdlit.deployment.node import check_class_paths

    check_class_paths("model: fdlit.models.SmallCNN\naggregator: FedAvg\nfederation:\n"
                      "  client_class: fdlit.clients.ClientModule\n", "")


def test_a_node_never_reads_a_file_the_config_names(tmp_path):
    from fdlit.deployment.node import check_class_paths

    with pytest.raises(ConfigError, match="names a file"):
        check_class_paths("config: [/dev/zero]\n", "")


def test_report_and_sweep_import_nothing_a_run_folder_names(evil, tmp_path, capsys):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(write_spelling(run, "section file") + "aggregator: evilmod.Net\n")
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")])
    assert not evil.exists() and "evilmod" not in sys.modules


def test_the_groups_are_the_fit_parsers():
    from fdlit.configuration.code_allowlist import CODE_FIELDS, GROUPS
    from fdlit.configuration.schema import fit_parser

    parser = fit_parser()
    groups = {name.split(".")[0] for name in parser.groups if name and "." not in name} - {"model", "aggregator"}
    assert set(GROUPS) == groups - {"server.model"}
    dests = {a.dest for a in parser._actions}
    assert all(field in dests for field in CODE_FIELDS)


def test_a_node_worker_answers_a_refused_set_up_with_its_one_line(evil, tmp_path):
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from fdlit.deployment.node import NodeWorker
    from fdlit.deployment.wire import pack, unpack

    worker = NodeWorker()
    worker.node_config = {"allowed-classes": "mylab."}
    payload = "seed: 0\nfederation:\n  client_class: evilmod.Net\n"  # the set-up request as the server sends it
    meta, _ = unpack(worker.handle(pack({"op": "setup", "config": payload, "clients": [0], "threads": 1}, {})))
    assert meta["error_kind"] == "ConfigError" and "\n" not in meta["error"]
    assert meta["error"].startswith("node-config allowed-classes: the run names ['evilmod.Net'] "
                                    "(federation.client_class in ")
    assert worker.loop is None and not evil.exists() and "evilmod" not in sys.modules


def test_the_import_guard_refuses_a_planted_module_and_lets_the_installation_through(evil):
    import importlib

    from fdlit.configuration.code_allowlist import CodeAllowlist, ImportGuard

    sys.modules.pop("colorsys", None)
    with ImportGuard(CodeAllowlist(())):
        with pytest.raises(ImportError, match="evilmod .* is outside this reader's allow-list"):
            importlib.import_module("evilmod")
        importlib.import_module("colorsys")  # the standard library
        importlib.import_module("fdlit.runs.export")
    assert not evil.exists() and "evilmod" not in sys.modules
    with ImportGuard(CodeAllowlist(["evilmod."])):  # the operator allows it
        importlib.import_module("evilmod")
    assert evil.exists()
