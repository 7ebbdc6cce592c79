import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fdlit.cli import main
from fdlit.configuration.schema import fit_parser
from fdlit.errors import ConfigError
from fdlit.reporting import write_report
from fdlit.runs import read_jsonl
from fdlit.sweeps.controller import agent_flags, expand_grid, load_sweep, lookup, plan, resolve, run_sweep
from tests.sweeping import TINY, alive, children, finished_dirs, write_sweep

REPO = Path(__file__).resolve().parents[1]
SWEEP_FILES = sorted((REPO / "sweeps").glob("*.yaml"))



def test_shipped_sweeps_exist():
    names = {p.name for p in SWEEP_FILES}
    assert {"tau.yaml", "classes_per_client.yaml", "tau_x_classes.yaml"} <= names


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_sweep_file_parameters_are_valid_fit_flags(path):
    """Parse (never run) every setting exactly as wandb agent would pass it: every combination of the
    swept values but the seed, and each seed once (a seed changes no other setting; `fdlit sweep` itself
    resolves every combination before it runs any)."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    spec = load_sweep(path)
    assert spec["method"] == "grid" and spec["metric"]["goal"] == "maximize"
    tail = spec["_fit_tail"]
    assert tail.index("${args}") > tail.index("--config")  # sweep values override the config
    planned = plan(spec)
    assert len(planned) == len(expand_grid(spec)) > 1
    seeds = list(dict.fromkeys(r.values.get("seed") for r in planned))
    runs = [r for r in planned if r.values.get("seed") == seeds[0]]  # every setting, at the first seed
    runs += [next(r for r in planned if r.values.get("seed") == s) for s in seeds[1:]]  # every other seed once
    assert len({r.group for r in runs}) == len({r.group for r in planned})
    resolve(runs, fit_parser)
    for run in runs:
        # our ${args} is the agent's own expansion, so local and W&B runs get identical flags
        command = {"args": {k: {"value": v} for k, v in run.values.items()}}
        assert agent_flags(run.values) == create_sweep_command_args(command)["args"]
        resolved = run.config["resolved"]
        for key, value in run.values.items():
            if key == "config":  # a swept config file: every setting it makes is in the resolved config
                from fdlit.runs.naming import flat

                made = flat(yaml.safe_load((REPO / "configs" / value).read_text()))
                assert made and all(lookup(resolved, k) == v for k, v in made.items()), (path.name, value)
                continue
            got = lookup(resolved, key)
            swept = yaml.safe_load(value) if isinstance(value, str) and value.startswith("{") else None
            if isinstance(swept, dict):  # a section swept as one mapping, e.g. data's partition fields together
                assert swept and all(lookup(got, k) == v for k, v in swept.items()), (path.name, key, value)
                continue
            if isinstance(got, dict) and "class_path" in got:  # a class path swept alone, e.g. an attack
                got = got["class_path"]
            assert got == value, (path.name, key)
        assert resolved["logger"]["group"] == run.group
    if "seed" in spec["parameters"]:  # seeds of one setting share a group
        groups = {r.group for r in planned}
        assert len(groups) == len(planned) // len(spec["parameters"]["seed"]["values"])


def test_tiny_grid_runs_every_combination_once_and_resumes(tmp_path, capsys):
    path = write_sweep(tmp_path, {"aggregator.tau": {"values": [0.0, 0.5]}, "seed": {"values": [0, 1]},
                                  "data.classes_per_client": {"value": 4}})
    extra = [*TINY, "--logger.run_dir", str(tmp_path / "runs")]
    assert main(["sweep", str(path), "--", *extra]) == 0
    dirs = finished_dirs(tmp_path / "runs")
    assert len(dirs) == 4
    seen = set()
    for d in dirs:
        config = yaml.safe_load((d / "config.yaml").read_text())
        tau, seed = lookup(config, "aggregator.tau"), config["seed"]
        assert lookup(config, "data.classes_per_client") == 4 and config["federation"]["rounds"] == 1
        assert config["logger"]["group"] == f"tiny-tau{tau}-k4"  # seeds of one setting share it
        assert config["logger"]["name"] == f"tiny-tau{tau}-k4-seed{seed}"
        seen.add((tau, seed))
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        trust = rows[-1]["clients/trust_matrix"]  # M x C; each class's column sums to 1 over clients
        assert len(trust) == 5 and len(trust[0]) == 10
        for c in range(10):
            if trust[0][c] is not None:
                assert sum(row[c] for row in trust) == pytest.approx(1.0, abs=1e-6)
    assert seen == {(0.0, 0), (0.0, 1), (0.5, 0), (0.5, 1)}

    # the report reads these real run directories (the keys the loop writes are the keys it uses)
    index = write_report(tmp_path / "runs", formats=("png",))
    table = (index.parent / "table1.md").read_text()
    assert "| AVG (sUWA τ=0) |" in table and "| sUWA τ=0.5 |" in table and "k=4" in table  # τ = 0 is AVG
    assert index.read_text().count("data:image/png;base64,") == 10  # Fig. 2, tau, chi vs k, App. B, chi, bytes; a trust matrix per run (2 tau x 2 seeds)

    capsys.readouterr()
    assert main(["sweep", str(path), "--", *extra]) == 0  # second invocation runs nothing new
    assert "4 finished, 0 to run" in capsys.readouterr().out
    assert finished_dirs(tmp_path / "runs") == dirs

    # a run killed mid-way (summary not finished) is the only one repeated
    summary_path = dirs[0] / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**summary, "finished": False}))
    result = run_sweep(path, extra, out=lambda s: None)
    assert (result["skipped"], result["ran"]) == (3, 1)
    assert len(finished_dirs(tmp_path / "runs")) == 4


def test_runs_saved_by_an_older_fdlit_are_found_again():
    """A finished run whose saved config predates a section or knob with a no-op default (here the
    adversaries section and logger.system_metrics, or the methods' former names) is the same combination:
    an upgrade re-runs nothing;
    a real difference (another tau, more rounds) is not."""
    from fdlit.configuration.schema import parse_fit
    from fdlit.sweeps.controller import same_run

    parser, cfg = parse_fit(["--config", "digits.yaml"])
    now = yaml.safe_load(parser.dump(cfg, skip_unset=False))
    old = json.loads(json.dumps(now))
    old.pop("adversaries")
    old["logger"].pop("system_metrics")
    assert same_run(old, now)
    assert not same_run({**old, "seed": 1}, now)
    assert not same_run({**old, "federation": {**old["federation"], "rounds": 99}}, now)
    assert not same_run({**old, "adversaries": {**now["adversaries"], "attack": "fdlit.adversaries.FreeRider"}}, now)
    former = {**old, "aggregator": {**now["aggregator"], "class_path": "fdlit.aggregators." + (
        now["aggregator"]["class_path"].rpartition(".")[2] + "Aggregator")}}  # saved before the methods' renames
    assert now["aggregator"]["class_path"] == "fdlit.methods.SmoothedUncertaintyWeighted" and same_run(former, now)
    assert not same_run({**former, "aggregator": {**now["aggregator"], "class_path": "fdlit.methods.FedAvg"}}, now)


def test_dry_run_lists_and_runs_nothing(tmp_path, capsys):
    path = write_sweep(tmp_path, {"aggregator": {"values": ["fdlit.methods.ProbabilityAveraging",
                                                            "fdlit.methods.UncertaintyWeighted"]},
                                  "data.classes_per_client": {"values": [2, 5]}})
    code = main(["sweep", str(path), "--dry_run", "--", *TINY, "--logger.run_dir", str(tmp_path / "runs")])
    assert code == 0
    out = capsys.readouterr().out
    assert "4 combinations, 0 finished, 4 to run" in out
    for group in ("tiny-avg-k2", "tiny-avg-k5", "tiny-uwa-k2", "tiny-uwa-k5"):
        assert f"group={group} " in out
    assert "--data.classes_per_client=5" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("parameters,command,field", [
    ({"data.no_such_key": {"values": [1]}}, None, "no_such_key"),
    ({"data.classes_per_client": {"values": [0]}}, None, "data.classes_per_client"),
    # 3 clients x 2 classes cannot cover digits' 10 classes: found before any run starts
    ({"data.num_clients": {"values": [5, 3]}}, None, "data.classes_per_client"),
    ({"aggregator.tau": {"min": 0.0, "max": 1.0}}, None, "parameters.aggregator.tau"),
    ({"seed": {"values": []}}, None, "parameters.seed.values"),
    ({"seed": {"values": [0]}}, ["python", "-m", "fdlit", "fit", "--config", "digits.yaml"], "command"),
    ({"seed": {"values": [0]}}, ["python", "-m", "fdlit", "fit", "${args}", "--config", "digits.yaml"], "${args}"),
])
def test_bad_sweep_files_name_the_field(tmp_path, parameters, command, field):
    path = write_sweep(tmp_path, parameters, command)
    with pytest.raises(ConfigError) as info:
        run_sweep(path, [*TINY, "--logger.run_dir", str(tmp_path / "runs")], dry_run=True, out=lambda s: None)
    assert field in str(info.value)
    assert not (tmp_path / "runs").exists()


def test_missing_sweep_file_is_a_clean_cli_error(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_a_sweep_file_that_is_a_folder_a_device_or_huge_is_refused_unread(tmp_path, capsys):
    huge = tmp_path / "huge.yaml"
    huge.write_text("# padding\n" * 200_000)
    targets = [(tmp_path, "is not a regular file"), (huge, "is larger than 1 MiB")]
    if Path("/dev/zero").exists():
        targets.append((Path("/dev/zero"), "is not a regular file"))  # read, it would never end
    for target, said in targets:
        start = time.monotonic()
        assert main(["sweep", str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"sweep: '{target}' {said}" in err[0], err
        assert time.monotonic() - start < 10


class InterruptRound:
    """Stands in for Ctrl-C / a kill: the first run of the sweep stops when ``round`` starts."""

    def __init__(self, round):
        self.round, self.done = round, False

    def patch(self, monkeypatch):
        from fdlit.federation.loop import FederationLoop

        original = FederationLoop.run_round

        def run_round(loop, r, clock=None):
            if r == self.round and not self.done:
                self.done = True
                raise KeyboardInterrupt
            return original(loop, r, clock)

        monkeypatch.setattr(FederationLoop, "run_round", run_round)


@pytest.mark.parametrize("stop_in_round", [2, 1], ids=["after-a-checkpoint", "before-any-checkpoint"])
def test_a_stopped_sweep_run_again_resumes_the_unfinished_run_in_its_own_folder(stop_in_round, tmp_path, capsys,
                                                                               monkeypatch):
    path = write_sweep(tmp_path, {"seed": {"values": [0, 1]}, "data.classes_per_client": {"value": 4}})
    extra = [*TINY, "--federation.rounds", "2", "--logger.run_dir", str(tmp_path / "runs")]
    InterruptRound(stop_in_round).patch(monkeypatch)
    assert main(["sweep", str(path), "--", *extra]) == 130
    assert "run the same sweep command again to continue" in capsys.readouterr().err
    (partial,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir() and d.name != ".sweep"]
    assert (partial / "checkpoint.pt").exists() == (stop_in_round == 2)

    assert main(["sweep", str(path), "--", *extra]) == 0
    out = capsys.readouterr().out
    assert "2 combinations, 0 finished, 2 to run (1 resumed in their own folder)" in out
    assert f"(resuming {partial})" in out
    dirs = sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir() and p.name != ".sweep")  # its bookkeeping
    assert len(dirs) == 2 and partial in dirs  # no second folder for the stopped combination
    assert finished_dirs(tmp_path / "runs") == dirs
    assert [r["round"] for r in read_jsonl(partial / "metrics.jsonl")] == [1, 2]
    assert main(["sweep", str(path), "--dry_run", "--", *extra]) == 0
    assert "2 combinations, 2 finished, 0 to run" in capsys.readouterr().out


def test_sweep_values_with_a_slash_make_flat_folders(tmp_path, capsys):
    hub_ids = ["org/model-a", "org/model-b"]
    path = write_sweep(tmp_path, {"data.tokenizer": {"values": hub_ids}, "data.classes_per_client": {"value": 4}})
    assert main(["sweep", str(path), "--", *TINY, "--logger.run_dir", str(tmp_path / "runs")]) == 0
    dirs = [d for d in (tmp_path / "runs").iterdir() if d.is_dir() and d.name != ".sweep"]
    assert len(dirs) == 2 and all((d / "summary.json").exists() for d in dirs)  # direct children, nothing nested
    names = {yaml.safe_load((d / "config.yaml").read_text())["logger"]["name"] for d in dirs}
    assert names == {"tiny-k4-tokenizerorg_model-a", "tiny-k4-tokenizerorg_model-b"}
    assert {lookup(yaml.safe_load((d / "config.yaml").read_text()), "data.tokenizer") for d in dirs} == set(hub_ids)


def test_random_sweeps_draw_run_cap_distinct_values_from_distributions_and_draw_them_again(tmp_path):
    parameters = {"aggregator.tau": {"min": 0.05, "max": 2.0, "distribution": "log_uniform_values"},
                  "data.classes_per_client": {"values": [2, 3, 4, 5]}, "seed": {"values": [0, 1]}}
    path = write_sweep(tmp_path, parameters)
    spec = {**yaml.safe_load(path.read_text()), "method": "random", "run_cap": 5}
    path.write_text(yaml.safe_dump(spec))
    lines = []
    run_sweep(path, [*TINY, "--logger.run_dir", str(tmp_path / "runs")], dry_run=True, out=lines.append)
    assert "5 combinations (random: 5 drawn of run_cap 5)" in lines[0]
    runs = plan(load_sweep(path))
    assert len(runs) == 5  # not the grid (which a continuous tau does not even have)
    taus = [r.values["aggregator.tau"] for r in runs]
    assert len(set(taus)) == 5 and all(0.05 <= t <= 2.0 for t in taus)
    assert {r.values["data.classes_per_client"] for r in runs} <= {2, 3, 4, 5}
    assert len({r.name for r in runs}) == 5 and all(f"tau{r.values['aggregator.tau']}" in r.name for r in runs)
    assert [r.values for r in plan(load_sweep(path))] == [r.values for r in runs]  # resumable: same draws
    # a discrete space smaller than run_cap gives each combination once
    spec = {**spec, "run_cap": 50, "parameters": {"seed": {"values": [0, 1, 2]}}}
    path.write_text(yaml.safe_dump(spec))
    assert sorted(r.values["seed"] for r in plan(load_sweep(path))) == [0, 1, 2]


@pytest.mark.parametrize("extra,field", [
    ({"method": "bayes"}, "method"),
    ({"method": "random"}, "run_cap"),
    ({"method": "random", "run_cap": 2, "parameters": {"aggregator.tau": {"min": 0, "max": 1, "distribution": "beta"}}},
     "parameters.aggregator.tau.distribution"),
])
def test_sweep_methods_without_a_local_sampler_are_refused_not_run_as_a_grid(tmp_path, extra, field):
    path = write_sweep(tmp_path, {"seed": {"values": [0, 1]}})
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **extra}))
    with pytest.raises(ConfigError) as info:
        run_sweep(path, [*TINY, "--logger.run_dir", str(tmp_path / "runs")], out=lambda s: None)
    assert field in str(info.value)
    assert not (tmp_path / "runs").exists()


def test_a_failed_run_is_recorded_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    from fdlit.federation.loop import FederationLoop

    original = FederationLoop.run_round

    def run_round(loop, r, clock=None):
        if loop.seed == 1:
            raise RuntimeError("disk on fire")
        return original(loop, r, clock)

    monkeypatch.setattr(FederationLoop, "run_round", run_round)
    path = write_sweep(tmp_path, {"seed": {"values": [1, 2]}, "data.classes_per_client": {"value": 4}})
    assert main(["sweep", str(path), "--", *TINY, "--logger.run_dir", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "tiny-k4-seed1 failed: RuntimeError: disk on fire" in err
    results = json.loads((tmp_path / "runs" / ".sweep" / "sweep-tiny.json").read_text())
    by_name = {r["name"]: r for r in results["runs"]}
    assert by_name["tiny-k4-seed1"]["status"] == "failed" and "disk on fire" in by_name["tiny-k4-seed1"]["error"]
    assert by_name["tiny-k4-seed2"]["status"] == "finished"  # the sweep went on after the failure
    assert json.loads((Path(by_name["tiny-k4-seed2"]["run_dir"]) / "summary.json").read_text())["finished"]


def test_jobs_run_in_parallel_processes_with_split_threads_and_own_folders(tmp_path, capsys):
    from fdlit.sweeps.controller import _threads

    path = write_sweep(tmp_path, {"seed": {"values": [0, 1]}, "data.classes_per_client": {"value": 4}})
    extra = [*TINY, "--logger.run_dir", str(tmp_path / "runs")]
    assert main(["sweep", str(path), "--jobs", "2", "--", *extra]) == 0
    assert "2 at a time" in capsys.readouterr().out
    runs = json.loads((tmp_path / "runs" / ".sweep" / "sweep-tiny.json").read_text())["runs"]
    assert sorted(r["name"] for r in runs) == ["tiny-k4-seed0", "tiny-k4-seed1"]
    assert all(r["status"] == "finished" and r["torch_threads"] == _threads(2) for r in runs)
    assert len({r["run_dir"] for r in runs}) == 2 and len(finished_dirs(tmp_path / "runs")) == 2
    assert main(["sweep", str(path), "--jobs", "2", "--", *extra]) == 0  # the parallel runs are found again
    assert "2 finished, 0 to run" in capsys.readouterr().out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_a_killed_parallel_sweep_leaves_no_worker_running(tmp_path):
    """SIGKILL gives the sweep no chance to clean up; its workers must still stop, not go on
    through the combinations already queued to them (they would race a re-run of the sweep)."""
    path = write_sweep(tmp_path, {"seed": {"values": [0, 1, 2, 3, 4, 5]}, "data.classes_per_client": {"value": 4}})
    extra = [*TINY, "--federation.rounds", "50", "--logger.run_dir", str(tmp_path / "runs")]
    sweep = subprocess.Popen([sys.executable, "-m", "fdlit", "sweep", str(path), "--jobs", "2", "--", *extra],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(list((tmp_path / "runs").glob("*/metrics.jsonl"))) < 2:  # both workers are in a run
            assert sweep.poll() is None and time.monotonic() < deadline, "the sweep did not start its runs"
            time.sleep(0.5)
        workers = children(sweep.pid)
        assert len(workers) >= 2
    finally:
        sweep.kill()
        sweep.wait()
    deadline = time.monotonic() + 60
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(alive(w) for w in workers), "workers outlived the killed sweep"
