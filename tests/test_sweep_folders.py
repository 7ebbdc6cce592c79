"""Where a sweep writes: its runs in ``runs/<sweep name>/`` unless ``--logger.run_dir`` names a folder, its
bookkeeping (results, lock) in that folder's ``.sweep/``, never among run folders; a sweep started before
sweeps had their own folder is found again."""

import glob
import json
import os

from fdlit.cli import main
from tests.fake_runs import fake_run
from tests.sweeping import TINY, finished_dirs, write_sweep


def _run_folders(folder):
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != ".sweep")


def test_a_sweep_writes_its_runs_to_its_own_folder_and_its_bookkeeping_apart(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "runs", "AVG", 2, 0, 0.5)  # a run of `make run`, beside which the sweep lands
    path = write_sweep(tmp_path, {"seed": {"values": [0, 1]}, "data.classes_per_client": {"value": 4}})
    assert main(["sweep", str(path), "--", *TINY]) == 0
    own = tmp_path / "runs" / "tiny"
    assert len(_run_folders(own)) == 2 and len(finished_dirs(own)) == 2
    assert sorted(os.listdir(tmp_path / "runs")) == ["20260101-000000-fd-AVG-tau0.25-k2-seed0", "tiny"]
    assert sorted(os.listdir(own / ".sweep")) == ["sweep-tiny.json", "sweep-tiny.lock"]
    records = json.loads((own / ".sweep" / "sweep-tiny.json").read_text())["runs"]
    assert all(r["status"] == "finished" and r["run_dir"].startswith(os.path.join("runs", "tiny", "")) for r in records)
    # the shell's glob of the sweep's name finds its folder, never a bookkeeping file
    assert glob.glob("runs/*tiny*") == [os.path.join("runs", "tiny")]
    capsys.readouterr()
    assert main(["report", *glob.glob("runs/*tiny*"), "--formats", "[png]"]) == 0
    assert "left out" not in capsys.readouterr().out  # the two runs of the sweep, and nothing else
    table = (own / "report" / "table1.md").read_text()
    assert "(n = 2 seeds per cell" in table
    # run again, it finds its runs; --logger.run_dir names the folder itself
    assert main(["sweep", str(path), "--dry_run", "--", *TINY]) == 0
    assert "2 combinations, 2 finished, 0 to run" in capsys.readouterr().out
    assert main(["sweep", str(path), "--dry_run", "--", *TINY, "--logger.run_dir", "elsewhere"]) == 0
    assert "--logger.run_dir=runs/tiny" not in capsys.readouterr().out


def test_a_sweep_started_before_sweeps_had_their_own_folder_continues_where_it_is(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, {"seed": {"values": [0, 1]}, "data.classes_per_client": {"value": 4}})
    runs = tmp_path / "runs"
    # the layout an earlier fdlit left: run folders and sweep-<name>.json/.lock directly in runs/
    assert main(["sweep", str(path), "--", *TINY, "--logger.run_dir", "runs"]) == 0
    (runs / ".sweep" / "sweep-tiny.json").rename(runs / "sweep-tiny.json")
    (runs / ".sweep" / "sweep-tiny.lock").rename(runs / "sweep-tiny.lock")
    (runs / ".sweep").rmdir()
    done = _run_folders(runs)
    capsys.readouterr()
    assert main(["sweep", str(path), "--", *TINY]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("fdlit sweep tiny: continuing in runs/, where this sweep was started before sweeps had a "
                      "folder of their own (runs/tiny/); to start it anew there: -- --logger.run_dir runs/tiny")
    assert "2 combinations, 2 finished, 0 to run" in out[1]
    assert _run_folders(runs) == done and not (runs / "tiny").exists()  # nothing ran again
    # its bookkeeping is moved out from among the run folders
    assert sorted(os.listdir(runs / ".sweep")) == ["sweep-tiny.json", "sweep-tiny.lock"]
    assert not (runs / "sweep-tiny.json").exists() and not (runs / "sweep-tiny.lock").exists()
    assert len(json.loads((runs / ".sweep" / "sweep-tiny.json").read_text())["runs"]) == 2
