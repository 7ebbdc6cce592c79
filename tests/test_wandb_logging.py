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


def test_wandb_start_up_is_bounded_and_said(fast_args, tmp_path, capsys, monkeypatch):
    calls = []

    def slow_service(**kwargs):
        calls.append(kwargs)
        if kwargs["mode"] == "online":  # what wandb raises when init_timeout passes
            raise wandb.errors.CommError(f"Run initialization has timed out after {kwargs['settings'].init_timeout} sec.")
        raise OSError("no offline either")

    monkeypatch.setattr(wandb, "init", slow_service)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert main(["fit", *fast_args, "--logger.mode", "online", "--logger.init_timeout_s", "2.5"]) == 0
    err = capsys.readouterr().err
    assert [c["settings"].init_timeout for c in calls] == [2.5, 2.5]
    assert "fdlit: starting the W&B run (waiting up to 2.5 s, then offline" in err
    assert "W&B unavailable (Run initialization has timed out after 2.5 sec.)" in err


def test_an_unreachable_wandb_server_costs_seconds_not_minutes(fast_args, tmp_path, capsys, monkeypatch):
    """A real wandb.init against a closed port: without the bound it waits its default 90 s."""
    monkeypatch.setenv("WANDB_API_KEY", "0123456789" * 4)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    start = time.monotonic()
    assert main(["fit", *fast_args, "--logger.mode", "online", "--logger.init_timeout_s", "2"]) == 0
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert "W&B online init failed" in err and "continuing offline" in err
    (run,) = (tmp_path / "runs").iterdir()
    assert any(p.name.startswith("offline-run-") for p in (run / "wandb").iterdir())
    print(f"fit with an unreachable W&B server: {took:.1f} s")
    assert took < 60
