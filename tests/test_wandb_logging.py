"""W&B integration: an offline run (no server, no credentials) holds the config and every round."""

import os
import re
import subprocess
import sys
import time

import pytest

from fdlit.cli import main
from tests.wandb_records import offline_record, read_wandb_records

wandb = pytest.importorskip("wandb")


# "": an exported but empty WANDB_MODE, which wandb.init itself rejects; fdlit drops it and says so
@pytest.mark.parametrize("env_mode", ["offline", ""])
def test_offline_run_saves_config_and_prints_sync_hint(fast_args, tmp_path, capsys, monkeypatch, env_mode):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", env_mode)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no stored credentials either
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the project folder, where the offline run is linked for `wandb sync`
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
    monkeypatch.chdir(tmp_path)
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
    monkeypatch.chdir(tmp_path)  # the project folder: a bare `wandb sync` looks in ./wandb
    wandb.teardown()  # settings an earlier test's wandb read from its environment (a run id) are not this run's


def wandb_sync_dry_run(cwd) -> list[str]:
    """The .wandb files a bare ``wandb sync`` run in ``cwd`` would upload (``--dry-run``: nothing is sent)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    done = subprocess.run([sys.executable, "-c", "from wandb.cli.cli import cli; cli()", "sync", "--dry-run"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [line.split()[-1] for line in (done.stdout + done.stderr).splitlines() if line.strip().endswith(".wandb")]


def test_under_the_agent_the_offline_run_records_what_ran(fast_args, tmp_path, capsys, monkeypatch):
    import json

    offline_env(monkeypatch, tmp_path)
    args = [*fast_args, "--federation.rounds", "1"]
    args[args.index("--logger.mode") + 1] = "offline"
    seen = {}
    for tau, seed in [(0.25, 0), (0.5, 0), (0.5, 1)]:
        flags = emulate_agent(monkeypatch, tmp_path, {
            "aggregator": "fdlit.methods.SmoothedUncertaintyWeighted", "aggregator.tau": tau,
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
        assert config["aggregator"] == "fdlit.methods.SmoothedUncertaintyWeighted"
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


def test_a_run_resumed_offline_keeps_one_folder_and_a_finished_run_opens_none(fast_args, tmp_path, capsys, monkeypatch):
    import torch

    offline_env(monkeypatch, tmp_path)
    args = [*fast_args, "--federation.rounds", "1", "--logger.init_timeout_s", "120"]  # a busy machine starts slowly
    args[args.index("--logger.mode") + 1] = "offline"
    assert main(["fit", *args]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "W&B unavailable" not in capsys.readouterr().err
    assert main(["fit", "--resume", str(run_dir), "--federation.rounds", "2"]) == 0
    out, err = capsys.readouterr()
    assert "W&B unavailable" not in err
    # one W&B run: the resumed session continues the id the checkpoint holds; wandb wrote a folder per
    # session, and the second one was merged into the first when it ended
    run_id = torch.load(run_dir / "checkpoint.pt", weights_only=False)["wandb_run_id"]
    (folder,) = (run_dir / "wandb").glob("offline-run-*")
    assert re.fullmatch(rf"offline-run-[0-9_]+-{run_id}", folder.name) and f"wandb sync {folder}" in out
    logs = sorted(folder.glob("*.wandb"), key=lambda f: f.name != f"run-{run_id}.wandb")  # the first session's first
    assert len(logs) == 2 and re.fullmatch(rf"run-{run_id}-[0-9_]+(-\d+)?\.wandb", logs[1].name)
    sessions = [read_wandb_records(log) for log in logs]
    runs = [next(r.run for r in records if r.WhichOneof("record_type") == "run") for records in sessions]
    assert [r.run_id for r in runs] == [run_id, run_id]
    assert runs[0].start_time.ToDatetime() < runs[1].start_time.ToDatetime()  # wandb sync uploads them in this order
    rounds = [{i.value_json for r in records if r.WhichOneof("record_type") == "history" for i in r.history.item
               if (i.key or "/".join(i.nested_key)) == "round"} for records in sessions]
    assert rounds == [{"1"}, {"2"}]
    named = [fi.path for records in sessions for r in records if r.WhichOneof("record_type") == "files"
             for fi in r.files.files]
    assert named and all((folder / "files" / path).is_file() for path in named)  # each log finds its files beside it
    assert sorted(wandb_sync_dry_run(tmp_path)) == sorted(f"wandb/{folder.name}/{log.name}" for log in logs)
    assert [p.name for p in (tmp_path / "wandb").glob("offline-run-*")] == [folder.name]  # one link in the project
    assert main(["fit", "--resume", str(run_dir), "--federation.rounds", "2"]) == 0
    err = capsys.readouterr().err
    assert "no W&B run opened" in err
    assert [f.name for f in (run_dir / "wandb").glob("offline-run-*")] == [folder.name]  # no new, empty run


def test_a_bare_wandb_sync_in_the_project_folder_finds_the_offline_run_with_its_config(fast_args, tmp_path, capsys,
                                                                                        monkeypatch):
    offline_env(monkeypatch, tmp_path)
    args = [*fast_args, "--federation.rounds", "1", "--logger.init_timeout_s", "120"]
    args[args.index("--logger.mode") + 1] = "offline"
    assert main(["fit", *args]) == 0
    printed = capsys.readouterr().out
    (run_dir,) = (tmp_path / "runs").iterdir()
    (folder,) = (run_dir / "wandb").glob("offline-run-*")
    assert f"or a bare `wandb sync` in {tmp_path}" in printed
    assert wandb_sync_dry_run(tmp_path) == [f"wandb/{folder.name}/{next(folder.glob('*.wandb')).name}"]
    assert (tmp_path / "wandb" / folder.name).resolve() == folder.resolve()
    # the resolved config and the printed summary are run files, recorded for upload
    assert (folder / "files" / "fdlit" / "config.yaml").read_text() == (run_dir / "config.yaml").read_text()
    summary = (folder / "files" / "fdlit" / "summary.txt").read_text()
    assert summary.startswith("fdlit summary:") and summary in printed
    (records,) = offline_record(run_dir, "files")
    saved = {f.path for r in records if r.WhichOneof("record_type") == "files" for f in r.files.files}
    assert {"fdlit/config.yaml", "fdlit/summary.txt"} <= saved
    # a deleted run directory's link is dropped when the next run links its own
    import shutil

    shutil.rmtree(run_dir)
    assert main(["fit", *args]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    (folder,) = (run_dir / "wandb").glob("offline-run-*")
    assert [p.name for p in (tmp_path / "wandb").glob("offline-run-*")] == [folder.name]


def test_online_without_credentials_is_refused_before_any_work(fast_args, tmp_path, capsys, monkeypatch):
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc there
    monkeypatch.chdir(tmp_path)
    assert main(["fit", *fast_args, "--logger.mode", "online"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fdlit: error: logger.mode: online needs W&B credentials")
    assert all(fix in err for fix in ("`wandb login`", "WANDB_API_KEY", "--logger.mode offline", "auto"))
    assert not (tmp_path / "runs").exists() and not (tmp_path / "wandb").exists()  # nothing was started
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    (tmp_path / ".netrc").chmod(0o600)
    from fdlit.runs.wandb_logger import has_wandb_credentials

    assert has_wandb_credentials()  # a `wandb login` entry counts


def agent_command_lines(spec: dict, combos: list[dict], monkeypatch, tmp_path) -> list[tuple[list[str], dict]]:
    """(command line, environment) that wandb's own ``Agent._command_run`` builds for each combination
    of a sweep file (the agent's code, only the process start recorded instead of made)."""
    from wandb import wandb_agent

    started = []

    class Recorded:
        def __init__(self, command=None, env=None, **_):
            started.append((command, env))

    monkeypatch.setattr(wandb_agent, "AgentProcess", Recorded)
    monkeypatch.setenv("WANDB_SWEEP_ID", "sweep1")
    for name in ("WANDB_RUN_ID", "WANDB_SWEEP_PARAM_PATH"):  # the agent sets these in os.environ: undone after
        monkeypatch.setenv(name, "")
    monkeypatch.chdir(tmp_path)  # the agent writes its parameter files under ./wandb
    agent = wandb_agent.Agent(api=None, queue=None, sweep_id="sweep1")
    agent._sweep_command = spec["command"]  # as Agent.run() takes it from the sweep's config
    for i, values in enumerate(combos):
        agent._command_run({"type": "run", "run_id": f"run{i}", "program": spec["program"],
                            "args": {k: {"value": v} for k, v in values.items()}})
    return started


@pytest.mark.parametrize("name", ["tau", "classes_per_client", "tau_x_classes", "digits_quick"])
def test_every_sweep_file_gives_the_agent_a_command_line_fdlit_parses(name, tmp_path, monkeypatch):
    from pathlib import Path

    import yaml

    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.naming import flat
    from fdlit.sweeps.controller import expand_grid

    path = Path(__file__).parents[1] / "sweeps" / f"{name}.yaml"
    spec = yaml.safe_load(path.read_text())
    assert spec["program"] and spec["command"][-1] == "${args}"
    combos = expand_grid(spec)[:2]
    for (command, env), values in zip(agent_command_lines(spec, combos, monkeypatch, tmp_path), combos, strict=True):
        assert command[:5] == ["/usr/bin/env", "python", "-m", "fdlit", "fit"]
        assert command[-len(values):] == [f"--{k}={v}" for k, v in values.items()]  # ${args}, last: they win
        assert (tmp_path / env["WANDB_SWEEP_PARAM_PATH"]).exists()
        _, cfg = parse_fit(command[5:])
        config = flat(cfg.as_dict())
        assert {k: config[k] for k in values} == values


def test_runs_started_by_wandb_agent_are_named_and_grouped_by_their_swept_values(tmp_path, monkeypatch):
    """The exact command line and environment ``wandb agent`` builds, run as the agent runs it."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    offline_env(monkeypatch, tmp_path)
    spec = yaml.safe_load((Path(__file__).parents[1] / "sweeps" / "tau.yaml").read_text())
    fit = spec["command"].index("${args}")  # the shipped command, with a tiny run's fixed flags before ${args}
    spec["command"][fit:fit] = [
        "--logger.progress=true", "--federation.rounds=1", "--federation.private_epochs_first=1",
        "--federation.public_epochs_first=1", "--data.num_clients=5", "--data.public_size=100",
        "--data.validation_size=30"]
    combos = [{"aggregator.tau": 0.25, "seed": 0}, {"aggregator.tau": 0.5, "seed": 0}]  # once the same name
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # `python`: this one
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen = []
    for command, env in agent_command_lines(spec, combos, monkeypatch, tmp_path):
        env.pop("WANDB_SERVICE", None)  # a wandb service this test process started is not the agent's
        done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "\x1b" not in done.stderr + done.stdout and "\r" not in done.stderr  # not a terminal: plain lines
        assert "round 1/1: acc " in done.stderr
        run_dir = max((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
        (records,) = offline_record(run_dir, "summary")
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        kinds = {r.WhichOneof("record_type") for r in records}
        assert not kinds & {"output", "output_raw"}  # no console capture into W&B
        seen.append((run.display_name, run.run_group))
    (name0, group0), (name1, group1) = seen
    assert name0.startswith("tau0.25-") and name0.endswith("-seed0") and name1.startswith("tau0.5-")
    # the group: every setting but the seed (seeds sharing a group: the emulated-agent test above)
    assert group0 != group1 and "seed" not in group0 + group1 and group0.startswith("tau0.25")
