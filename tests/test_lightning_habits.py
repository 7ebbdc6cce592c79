"""The LightningModule path as a Lightning user expects it: the shipped example learns, the hooks a
federation does not call are named in one line each, and Trainer flags and Lightning CLI commands
are answered with fdlit's equivalent. Through fdlit.cli.main."""

import json
from pathlib import Path

import pytest

from fdlit.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("argv,field,equivalent", [
    (["fit", "--config", "digits.yaml", "--trainer.max_epochs", "5"], "trainer.max_epochs", "--federation.private_epochs"),
    (["fit", "--config", "digits.yaml", "--ckpt_path", "last.ckpt"], "ckpt_path", "fdlit fit --resume RUN_DIR"),
    (["fit", "--config", "digits.yaml", "--ckpt_path=last.ckpt"], "ckpt_path", "fdlit fit --resume RUN_DIR"),
    (["fit", "--trainer.accelerator", "gpu"], "trainer.accelerator", "--federation.accelerator"),
    (["fit", "--trainer.gradient_clip_val", "1"], "trainer.gradient_clip_val", "fdlit has no trainer section"),
    (["validate", "--config", "digits.yaml"], "command", "fdlit export RUN_DIR"),
    (["predict"], "command", "fdlit export RUN_DIR"),
])
def test_lightning_flags_and_commands_are_answered_with_fdlits_equivalent(capsys, argv, field, equivalent):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"fdlit: error: {field}: ") and equivalent in err, err


OWN = '''
import torch
import torch.nn.functional as F
import lightning.pytorch as pl


class Chatty(pl.LightningModule):
    def __init__(self, input_shape=(1, 8, 8), num_classes=10):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, num_classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)
'''


def tiny(tmp_path, *extra):
    return ["fit", "--config", str(ROOT / "configs/digits_avg.yaml"), "--logger.mode", "disabled",
            "--logger.progress", "false", "--logger.run_dir", str(tmp_path / "runs"), *extra]


def test_hooks_fdlit_does_not_call_are_named_once_each(tmp_path, monkeypatch, capsys):
    (tmp_path / "chatty.py").write_text(OWN)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(tiny(tmp_path, "--model", "chatty.Chatty", "--federation.rounds", "1",
                     "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
                     "--data.num_clients", "5")) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fdlit: note: ")]
    assert len(notes) == 2, notes  # once per run, not once per client
    assert "Chatty.validation_step is not called: fdlit evaluates" in notes[0]
    assert "prog_bar=True" in notes[1] and "clients/log/<name>" in notes[1]
    # the logged value itself is kept
    (run,) = (tmp_path / "runs").iterdir()
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert "clients/log/train_loss" in row


def test_the_example_lightning_module_learns_on_digits(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    assert main(tiny(tmp_path, "--config", str(EXAMPLES / "lightning_client.yaml"), "--federation.rounds", "5")) == 0
    assert "fdlit: note:" not in capsys.readouterr().err  # the example uses every part it has
    (summary,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/summary.json")]
    assert summary["best_global_acc_mean"] >= 0.6, summary["best_global_acc_mean"]
