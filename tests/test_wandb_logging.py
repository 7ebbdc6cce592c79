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
    assert out.index("fdlit summary") > out.rindex("wandb sync")  # the summary comes last, after W&B's lines
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


def read_wandb_records(path):
    """The records of an offline ``.wandb`` file, decoded with wandb's own protobufs. The file is
    wandb's LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks (crc32 4 bytes,
    length 2, type 1: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left in the block for a chunk header: padding
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def offline_record(run_dir, wanted: str, timeout: float = 20.0):
    """The records of the run directory's offline W&B runs, once the ``wanted`` record kind is in
    (wandb's service process may still be flushing right after finish())."""
    deadline = time.time() + timeout
    while True:
        runs = sorted((run_dir / "wandb").glob("offline-run-*"))
        found = [read_wandb_records(next(r.glob("*.wandb"))) for r in runs]
        if all(any(rec.WhichOneof("record_type") == wanted for rec in recs) for recs in found) or time.time() > deadline:
            return found
        time.sleep(0.5)


def emulate_agent(monkeypatch, tmp_path, args: dict):
    """What ``wandb agent`` does before starting a run (wandb.wandb_agent.Agent._command_run): the
    parameter file, the sweep's environment and the ``${args}`` flags, made with wandb's own helpers."""
    from wandb.sdk.launch.sweeps import utils as sweep_utils
    from wandb.sdk.lib import config_util

    wandb.teardown()  # each agent run is a new process: wandb's settings are read from the environment anew
    command = {"args": {k: {"value": v} for k, v in args.items()}, "run_id": f"run{len(list(tmp_path.iterdir()))}"}
    param_path = tmp_path / f"config-{command['run_id']}.yaml"
    config_util.save_config_file_from_dict(str(param_path), command["args"])
    monkeypatch.setenv("WANDB_SWEEP_ID", "sweep1")
    monkeypatch.setenv("WANDB_SWEEP_PARAM_PATH", str(param_path))
    return sweep_utils.create_sweep_command_args(command)["args"]


def offline_env(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))


def test_under_the_agent_the_offline_run_records_what_ran(fast_args, tmp_path, capsys, monkeypatch):
    import json

    offline_env(monkeypatch, tmp_path)
    args = [*fast_args, "--federation.rounds", "1"]
    args[args.index("--logger.mode") + 1] = "offline"
    seen = {}
    for tau, seed in [(0.25, 0), (0.5, 0), (0.5, 1)]:
        flags = emulate_agent(monkeypatch, tmp_path, {
            "aggregator": "fdlit.aggregators.SmoothedUncertaintyWeightedAggregator", "aggregator.tau": tau,
            "data.classes_per_client": 3, "seed": seed})
        assert flags[1] == f"--aggregator.tau={tau}"  # the ${args} form the command line receives
        before = set((tmp_path / "runs").glob("*"))
        assert main(["fit", *args, *flags]) == 0
        out = capsys.readouterr().out
        (run_dir,) = set((tmp_path / "runs").glob("*")) - before
        (records,) = offline_record(run_dir, "summary")
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        config = {i.key: json.loads(i.value_json) for i in run.config.update}  # at init, then updates
        config.update({i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "config"
                       for i in r.config.update})
        summary = {i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "summary"
                   for i in r.summary.update}
        assert config["aggregator"] == "fdlit.aggregators.SmoothedUncertaintyWeightedAggregator"
        assert config["aggregator.tau"] == tau  # the swept class keeps its init_args
        assert config["data.classes_per_client"] == 3 and "data" not in config  # one key, not flat and nested
        assert config["model.hidden"] == [128, 128]
        # the sweep files' metric, as a plain number, and the best of it
        assert isinstance(summary["after_public/global_acc_mean"], float)
        assert isinstance(summary["best/after_public/global_acc_mean"], float)
        assert f"wandb sync {run_dir / 'wandb'}/offline-run-" in out
        seen[(tau, seed)] = (run.display_name, run.run_group)
    names = [n for n, _ in seen.values()]
    assert len(set(names)) == 3 and "tau0.25" in seen[(0.25, 0)][0] and "seed1" in seen[(0.5, 1)][0]
    assert seen[(0.5, 0)][1] == seen[(0.5, 1)][1] != seen[(0.25, 0)][1]  # a group: every setting but the seed


def test_resume_names_every_offline_folder_and_a_finished_run_opens_none(fast_args, tmp_path, capsys, monkeypatch):
    offline_env(monkeypatch, tmp_path)
    args = [*fast_args, "--federation.rounds", "1"]
    args[args.index("--logger.mode") + 1] = "offline"
    assert main(["fit", *args]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    capsys.readouterr()
    assert main(["fit", "--resume", str(run_dir), "--federation.rounds", "2"]) == 0
    out = capsys.readouterr().out
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(str(f) in out for f in folders)  # one sync command for both sessions
    assert main(["fit", "--resume", str(run_dir), "--federation.rounds", "2"]) == 0
    err = capsys.readouterr().err
    assert "no W&B run opened" in err
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 2  # no new, empty run
