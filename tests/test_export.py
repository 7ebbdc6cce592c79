"""``fdlit export``: a trained network as TorchScript with its input step and model card, loadable with torch
alone (no fdlit); or as a plain state dict."""

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
    from fdlit.configuration.schema import parse_fit

    run_dir, args = trained_run
    out = tmp_path / "client2.pt"
    assert main(["export", str(run_dir), "--client", "2", "--out", str(out), "--format", "state_dict"]) == 0
    assert "client 2 after round 2" in capsys.readouterr().out
    assert not (tmp_path / "client2.json").exists()  # a model card comes with TorchScript
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


LOAD_TORCHSCRIPT = """
import sys
sys.path.append(sys.argv[4])  # torch's site-packages only: no .pth files run, no editable fdlit install
try:
    import fdlit  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("fdlit is importable in the loading process")
import json
import torch
files = {"model_card.json": ""}
net = torch.jit.load(sys.argv[1], _extra_files=files)
card = json.loads(files["model_card.json"])
x = torch.load(sys.argv[2])
assert str(x.dtype) == "torch." + card["input"]["dtype"] and list(x.shape[1:]) == card["input"]["shape"][1:]
with torch.no_grad():
    torch.save(net(x), sys.argv[3])
"""


def test_a_torchscript_export_loads_without_fdlit_and_gives_the_clients_logits(trained_run, tmp_path, capsys):
    from fdlit.configuration.schema import parse_fit
    from fdlit.data import FederatedData
    from fdlit.runs.checkpoint import load_checkpoint
    from fdlit.runs.directory import read_config
    from fdlit.runs.export import _trained_loop

    run_dir, args = trained_run
    out = tmp_path / "client2.pt"
    assert main(["export", str(run_dir), "--client", "2", "--out", str(out)]) == 0
    assert "model card" in capsys.readouterr().out
    _, cfg = parse_fit(args)
    data = FederatedData(**cfg.data.as_dict())
    data.setup(cfg.seed)
    torch.save(data.test.x, tmp_path / "x.pt")
    client = _trained_loop(run_dir, load_checkpoint(run_dir / "checkpoint.pt")).view.clients[2].model.eval()
    with torch.no_grad():
        expected = client(data.test.x)
    site = str(Path(torch.__file__).parents[1])
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = subprocess.run([sys.executable, "-I", "-S", "-c", LOAD_TORCHSCRIPT, str(out), str(tmp_path / "x.pt"),
                           str(tmp_path / "logits.pt"), site], cwd=outside, env={"PATH": "/usr/bin:/bin",
                          "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    logits = torch.load(tmp_path / "logits.pt")
    assert (logits - expected).abs().max() < 1e-5
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    accuracy = (logits.argmax(-1) == data.test.y).float().mean().item()
    assert accuracy == pytest.approx(last["clients/after_public/global_acc"][2], abs=1e-6)
    # the card beside the file: what it is, what it takes, how it did
    card = json.loads((tmp_path / "client2.json").read_text())
    assert card["model"] == "client 2" and card["round"] == 2 and len(card["client_classes"]) == 3
    assert card["classes"] == [str(c) for c in range(10)]
    assert card["input"]["shape"] == [None, 1, 8, 8] and card["input"]["dtype"] == "float32"
    # the digits' 0..16 pixels are divided by 16 as fdlit loads them: the card says what to feed
    assert card["input"]["preprocessing"].startswith("pixels 0..16 divided by 16")
    assert card["config"] == read_config(run_dir)
    assert card["metrics"]["after_public/global_acc"] == last["clients/after_public/global_acc"][2]
    assert card["metrics"]["run"]["rounds"] == 2


def test_the_traced_network_holds_its_input_step_without_augmentation():
    from fdlit.data.augment import ImageInput, WithInput
    from fdlit.runs.export import traced

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    module = WithInput(ImageInput(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), augment=True, padding=2), net).train()
    x = torch.randint(0, 256, (5, 3, 8, 8), dtype=torch.uint8)
    scripted = traced(module, x)
    mean, std = torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    by_hand = net((x.float() / 255 - mean) / std)
    with torch.no_grad():
        assert torch.allclose(scripted(x), by_hand, atol=1e-6)
        assert torch.equal(scripted(x[:2]), scripted(x)[:2])  # any batch size; no random crop or flip
    assert module.training  # the run's module is left as it was


def test_a_model_card_that_would_overwrite_the_model_is_refused(trained_run, tmp_path, capsys):
    run_dir, _ = trained_run
    assert main(["export", str(run_dir), "--client", "0", "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out: the model card goes beside the model as m.json" in err[0], err
    assert main(["export", str(run_dir), "--client", "0", "--out", str(tmp_path / "m.pt"), "--format", "onnx"]) == 2
    assert "format" in capsys.readouterr().err and not list(tmp_path.iterdir())


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


def test_a_damaged_checkpoint_is_named_in_exports_words(trained_run, tmp_path, capsys):
    import shutil

    run_dir, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    data = bytearray((copy / "checkpoint.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped bit inside the tensors
    (copy / "checkpoint.pt").write_bytes(bytes(data))
    assert main(["export", str(copy), "--client", "0", "--out", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: run_dir: "), err
    assert "resume" not in err[0] and "start the run again" not in err[0]
    assert err[0].endswith(f"nothing intact is left to export; train it again with: python -m fdlit fit --config "
                           f"{copy / 'config.yaml'}")
    assert not (tmp_path / "m.pt").exists()


def test_a_kept_checkpoint_can_be_exported(trained_run, tmp_path, capsys):
    import shutil

    run_dir, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.copy(copy / "checkpoint.pt", copy / "checkpoint-r2.pt")  # kept by checkpoint.keep
    (copy / "checkpoint.pt").write_bytes(b"damaged")
    assert main(["export", str(copy), "--client", "1", "--out", str(tmp_path / "m.pt")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.endswith(f"the newest intact checkpoint kept is round 2's; export it with: python -m fdlit export "
                         f"{copy / 'checkpoint-r2.pt'} --client 1 --out {tmp_path / 'm.pt'}"), line
    assert main(["export", str(copy / "checkpoint-r2.pt"), "--client", "1", "--out", str(tmp_path / "m.pt")]) == 0
    assert "client 1 after round 2" in capsys.readouterr().out


def test_a_fashion_mnist_card_names_the_real_classes(tmp_path, capsys):
    import paper_fixtures  # noqa: F401  (offline HF env first)
    from paper_fixtures import idx_folder

    data = tmp_path / "idx"
    data.mkdir()
    idx_folder(data, n_train=300, n_test=40)
    assert main(["fit", "--config", "fashion_mnist.yaml", "--data.data_dir", str(data), "--logger.mode", "disabled",
                 "--logger.progress", "false", "--logger.run_dir", str(tmp_path / "runs"), "--federation.rounds", "1",
                 "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
                 "--data.num_clients", "4", "--data.classes_per_client", "5", "--data.samples_per_client", "20",
                 "--data.public_size", "60", "--data.validation_size", "30", "--federation.eval_subsample", "null"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert main(["export", str(run_dir), "--client", "0", "--out", str(tmp_path / "c0.pt")]) == 0
    card = json.loads((tmp_path / "c0.json").read_text())
    assert card["classes"] == ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                               "Bag", "Ankle boot"]
    assert "pixels / 255" in card["input"]["preprocessing"] and "divided by 16" not in card["input"]["preprocessing"]
