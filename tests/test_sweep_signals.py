"""``kill`` (SIGTERM) stops a sweep as Ctrl-C does: every unfinished run keeps its last checkpoint, one
line says how to continue, exit status 130, and with ``--jobs`` no worker or semaphore is left behind."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fdlit.cli import main
from tests.sweeping import TINY, alive, children, write_sweep

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigterm_stops_a_sweep_as_ctrl_c_does(tmp_path, capsys, jobs):
    path = write_sweep(tmp_path, {"seed": {"values": [0, 1, 2]}, "data.classes_per_client": {"value": 4}})
    extra = [*TINY, "--federation.rounds", "200", "--logger.run_dir", str(tmp_path / "runs")]  # none ends first
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sweep = subprocess.Popen([sys.executable, "-m", "fdlit", "sweep", str(path), "--jobs", jobs, "--", *extra],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "runs"
    deadline = time.monotonic() + 240
    while len(list(runs.glob("*/checkpoint.pt"))) < int(jobs):  # every worker has a run with a checkpoint
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()[1][-3000:]
        time.sleep(0.3)
    workers = children(sweep.pid)
    sweep.send_signal(signal.SIGTERM)
    _, err = sweep.communicate(timeout=240)
    assert sweep.returncode == 130, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == ("fdlit: interrupted; run the same sweep command again to continue: finished runs are "
                         "skipped and an unfinished one resumes in its own folder"), err[-3000:]
    assert "leaked semaphore" not in err and "Traceback" not in err, err[-3000:]
    # the sweep exits once its workers are joined; multiprocessing's resource tracker, also a child, ends
    # when the sweep's end closes its pipe, a moment later on a loaded machine
    settle = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < settle:
        time.sleep(0.1)
    assert not any(alive(w) for w in workers), "processes of the sweep outlived it"
    started = [p for p in runs.iterdir() if p.is_dir() and p.name != ".sweep"]
    # no queued run started after the signal (with --jobs, the pool had handed a worker one ahead of time)
    assert len(started) == int(jobs) and all((p / "checkpoint.pt").exists() for p in started)
    capsys.readouterr()
    assert main(["sweep", str(path), "--dry_run", "--", *extra]) == 0
    out = capsys.readouterr().out
    counts = re.search(r"3 combinations, (\d) finished, (\d) to run \((\d) resumed in their own folder\)", out)
    assert counts, out  # every run it started is found again: finished, or resumed from its checkpoint
    finished, _, resumed = map(int, counts.groups())
    assert finished == 0 and resumed == len(started)  # the signal stopped every run mid-way


def test_a_run_whose_checkpoint_is_damaged_names_what_starts_it_anew(tmp_path, capsys):
    import json
    import shutil

    path = write_sweep(tmp_path, {"seed": {"values": [0]}, "data.classes_per_client": {"value": 4}})
    runs = tmp_path / "runs"
    extra = [*TINY, "--logger.run_dir", str(runs)]
    assert main(["sweep", str(path), "--", *extra]) == 0
    (run,) = [p for p in runs.iterdir() if p.is_dir() and p.name != ".sweep"]
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "finished": False}))  # stopped, as it seems
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    capsys.readouterr()
    assert main(["sweep", str(path), "--", *extra]) == 1
    err = capsys.readouterr().err
    assert f"the sweep resumes {run} every time it runs: move that folder out of {runs}" in err, err
    shutil.move(str(run), str(tmp_path / "aside"))  # what the line says
    assert main(["sweep", str(path), "--", *extra]) == 0
