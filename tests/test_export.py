"""``fdlit export``: a trained network as a plain state dict, loadable with torch alone."""

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fdlit.cli import main

LOAD = """
import importlib, sys
import torch
state = torch.load(sys.argv[1], weights_only=True)  # plain data only: no pickled objects
module, _, name = state["class_path"].rpartition(".")
net = getattr(importlib.import_module(module), name)(**state["init_args"])
net.load_state_dict(state["state_dict"])
net.eval()
with torch.no_grad():
    torch.save(net(torch.load(sys.argv[2])).argmax(-1), sys.argv[3])
assert not any(m.startswith(("fdlit.federation", "fdlit.runs", "lightning")) for m in sys.modules), "loop imported"
"""


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    args = ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp / "runs"), "--federation.rounds", "2", "--federation.private_epochs_first", "2",
            "--federation.private_epochs", "1", "--federation.public_epochs_first", "1",
            "--federation.public_epochs", "1", "--data.num_clients", "4", "--data.classes_per_client", "3",
            "--data.public_size", "200"]
    assert main(["fit", *args]) == 0
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir, args


def test_an_exported_client_predicts_as_the_run_did_with_torch_alone(trained_run, tmp_path, capsys):
    from fdlit.config import parse_fit

    run_dir, args = trained_run
    out = tmp_path / "client2.pt"
    assert main(["export", str(run_dir), "--client", "2", "--out", str(out)]) == 0
    assert "client 2 after round 2" in capsys.readouterr().out
    state = torch.load(out, weights_only=True)
    assert state["source"]["model"] == "client 2" and state["init_args"]["num_classes"] == 10
    assert state["input"] is None and len(state["source"]["classes"]) == 3
    # the run's test set, built as the run built it
    _, cfg = parse_fit(args)
    from fdlit.data import FederatedData

    data = FederatedData(**cfg.data.as_dict())
    data.setup(cfg.seed)
    torch.save(data.test.x, tmp_path / "x.pt")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD, str(out), str(tmp_path / "x.pt"), str(tmp_path / "p.pt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    accuracy = (torch.load(tmp_path / "p.pt") == data.test.y).float().mean().item()
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    # the run measured this client's accuracy on the same test set at the end of its last round
    assert accuracy == pytest.approx(last["clients/after_public/global_acc"][2], abs=1e-6)
    assert accuracy != pytest.approx(last["clients/after_public/global_acc"][0], abs=1e-6)  # not any client's


def test_export_refuses_what_the_run_does_not_have(trained_run, tmp_path, capsys):
    run_dir, _ = trained_run
    cases = [(["--client", "4"], "client: the run has 4 client(s): 0..3; got 4"),
             (["--server"], "server: this run has no server model"),
             ([], "client: choose the model to export: --client 0..3"),
             (["--client", "0", "--server"], "client: choose one model")]
    for flags, message in cases:
        assert main(["export", str(run_dir), *flags, "--out", str(tmp_path / "m.pt")]) == 2
        assert message in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--client", "0", "--out", str(tmp_path / "m.pt")]) == 2
    assert "not an fdlit run directory" in capsys.readouterr().err
    assert not (tmp_path / "m.pt").exists()


def test_export_arguments_are_checked_before_the_checkpoint_is_read(trained_run, tmp_path, capsys, monkeypatch):
    import fdlit.runs.export as export

    def never(path):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(export, "load_checkpoint", never)
    run_dir, _ = trained_run
    cases = [(["--client", "-1"], "client: must be a client's index, 0 or more; got -1"),
             (["--client", "0", "--server"], "client: choose one model"),
             (["--client", "0", "--out", str(tmp_path / "missing" / "m.pt")], "its folder does not exist")]
    for flags, message in cases:
        out = [] if "--out" in flags else ["--out", str(tmp_path / "m.pt")]
        assert main(["export", str(run_dir), *flags, *out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_an_input_step_in_front_of_the_network_is_described():
    from fdlit.data.augment import ImageInput
    from fdlit.runs.export import describe_input

    described = describe_input(ImageInput(mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2), augment=True))
    assert described["class_path"] == "fdlit.data.augment.ImageInput"
    assert described["init_args"]["mean"] == pytest.approx([0.5, 0.4, 0.3])
    assert describe_input(None) is None


# ---------------------------------------------------------------------------------- where it writes
def test_export_onto_the_runs_own_checkpoint_is_refused_and_the_checkpoint_is_unchanged(trained_run, capsys):
    run_dir, _ = trained_run
    checkpoint = run_dir / "checkpoint.pt"
    before = checkpoint.read_bytes()
    for target in (checkpoint, run_dir / "config.yaml", run_dir / "model.pt"):
        assert main(["export", str(run_dir), "--client", "0", "--out", str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "inside the run directory" in err[0] and str(target) in err[0], err
    assert checkpoint.read_bytes() == before and not (run_dir / "model.pt").exists()
    assert not list(run_dir.glob("*.tmp"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_export_to_a_device_is_refused_and_the_device_stays_a_device(trained_run, capsys):
    run_dir, _ = trained_run
    assert main(["export", str(run_dir), "--client", "0", "--out", "/dev/full"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'/dev/full' is not a regular file" in err[0], err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_export_to_a_link_or_a_folder_is_refused(trained_run, tmp_path, capsys):
    run_dir, _ = trained_run
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "link.pt").symlink_to(victim)
    (tmp_path / "folder.pt").mkdir()
    for target, said in ((tmp_path / "link.pt", "is a link"), (tmp_path / "folder.pt", "is a folder")):
        assert main(["export", str(run_dir), "--client", "0", "--out", str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    assert victim.read_text() == "keep me" and (tmp_path / "link.pt").is_symlink()


def test_export_to_a_full_disk_says_so_in_one_line_and_leaves_no_temporary_file(trained_run, tmp_path, capsys,
                                                                                monkeypatch):
    run_dir, _ = trained_run
    out = tmp_path / "model.pt"
    out.write_bytes(b"an earlier export")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert main(["export", str(run_dir), "--client", "0", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fdlit: stopped: No space left on device: {out}; nothing was changed"], err
    assert out.read_bytes() == b"an earlier export" and sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


# ---------------------------------------------------------------------------------- what it imports
EVIL = "from pathlib import Path\nPath({touched!r}).write_text('ran')\nimport torch\nclass Net(torch.nn.Module):\n" \
       "    def __init__(self, **kwargs):\n        super().__init__()\n"


def run_naming(trained_run, tmp_path, monkeypatch, edit):
    """A copy of the trained run whose config.yaml ``edit`` changed, and ``evilmod.py`` in the working
    folder that leaves a file behind when it is imported."""
    import shutil

    import yaml

    run_dir, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    edit(config)
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    touched = tmp_path / "evilmod-ran"
    (tmp_path / "evilmod.py").write_text(EVIL.format(touched=str(touched)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return copy, touched


@pytest.mark.parametrize("key,edit", [
    ("model.class_path", lambda c: c["model"].update(class_path="evilmod.Net")),
    ("federation.client_class", lambda c: c["federation"].update(client_class="evilmod.Net")),
    ("aggregator.class_path", lambda c: c["aggregator"].update(class_path="fdlit.runs.export.importlib.import_module")),
])
def test_export_never_imports_a_class_path_from_outside_fdlit(key, edit, trained_run, tmp_path, capsys, monkeypatch):
    copy, touched = run_naming(trained_run, tmp_path, monkeypatch, edit)
    assert main(["export", str(copy), "--client", "0", "--out", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: {key}: ") and err[0].endswith("add --trust_config")
    assert not touched.exists() and "evilmod" not in sys.modules and not (tmp_path / "m.pt").exists()


def test_trust_config_lets_the_runs_own_code_run(trained_run, tmp_path, capsys, monkeypatch):
    copy, touched = run_naming(trained_run, tmp_path, monkeypatch, lambda c: c["model"].update(class_path="evilmod.Net"))
    try:
        main(["export", str(copy), "--client", "0", "--out", str(tmp_path / "m.pt"), "--trust_config"])
    finally:
        sys.modules.pop("evilmod", None)
    assert touched.read_text() == "ran"  # asked for, the run's class is imported (and its code runs)
