"""W&B integration: an offline run (no server, no credentials) holds the config and every round."""

import os
import time

import pytest

from fdlit.cli import main

wandb = pytest.importorskip("wandb")


# "": an exported but empty WANDB_MODE, which wandb.init itself rejects; fdlit drops it and says so
@pytest.mark.parametrize("env_mode", ["offline", ""])
def test_offline_run_saves_config_and_prints_sync_hint(fast_args, tmp_path, capsys, monkeypatch, env_mode):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", env_mode)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no stored credentials either
    monkeypatch.setenv("HOME", str(tmp_path))
    args = [a for a in fast_args]
    args[args.index("--logger.mode") + 1] = "auto"  # auto + no credentials -> offline
    assert main(["fit", *args, "--aggregator.tau", "0.4"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "wandb sync" in out
    assert ("ignoring WANDB_MODE=''" in captured.err) == (env_mode == "")
    assert "W&B unavailable" not in captured.err
    (run_dir,) = list((tmp_path / "runs").iterdir())
    offline = [p for p in (run_dir / "wandb").iterdir() if p.name.startswith("offline-run-")]
    assert len(offline) == 1
    # the offline record (protobuf) holds the config and the per-round metrics as JSON strings
    # (wandb's service process may still be flushing it right after finish(): poll briefly)
    wanted = (b"classes_per_client", b"0.4", b"after_public/global_acc_mean", b"weights/chi")
    deadline = time.time() + 15
    while True:
        record = next(offline[0].glob("*.wandb")).read_bytes()
        if all(w in record for w in wanted) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert all(w in record for w in wanted), [w for w in wanted if w not in record]
    assert not os.environ.get("WANDB_API_KEY")
