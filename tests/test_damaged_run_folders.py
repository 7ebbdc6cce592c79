"""Run folders with a damaged file: a metrics.jsonl line or a summary.json that cannot be parsed within
limits (not JSON, or nested so deep that a parser would exhaust its recursion) is skipped and counted by
``report`` and ``sweep``, and ``fit --resume`` rebuilds the log from the checkpoint."""

import json
import shutil

import yaml

from fdlit.cli import main
from fdlit.runs import read_jsonl
from tests.fake_runs import fake_run, md_cells
from tests.sweeping import write_sweep

DEEP_LINE = "[" * 200_000 + "\n"  # a parser without a depth bound recurses 200,000 times
DEEP_SUMMARY = "[" * 100_000 + "]" * 100_000


def test_report_skips_deep_and_damaged_lines_with_a_count_and_leaves_out_a_deep_summary(tmp_path, capsys):
    clean = tmp_path / "clean"
    fake_run(clean, "AVG", 2, 0, 0.50)
    assert main(["report", str(clean), "--formats", "[png]"]) == 0
    row = md_cells((clean / "report" / "table1.md").read_text(), "AVG")

    root = tmp_path / "runs"
    damaged = fake_run(root, "AVG", 2, 0, 0.50)
    lines = (damaged / "metrics.jsonl").read_text().splitlines(keepends=True)
    # a deep line among the rows, one that is not JSON, and a deep last line (complete, not torn)
    (damaged / "metrics.jsonl").write_text(lines[0] + DEEP_LINE + lines[1] + "{not json\n" + lines[2] + DEEP_LINE)
    deep = fake_run(root, "sUWA", 2, 0, 0.60)
    (deep / "summary.json").write_text(DEEP_SUMMARY)
    capsys.readouterr()
    assert main(["report", str(root), "--formats", "[png]"]) == 0
    out = capsys.readouterr().out
    assert f"3 unreadable line(s) of metrics.jsonl skipped (damaged, or nested too deep): {damaged.name} (3)" in out
    assert f"{deep.name} (summary.json is nested deeper than 64 levels, not a summary fdlit writes)" in out
    assert md_cells((root / "report" / "table1.md").read_text(), "AVG") == row  # the readable rows, as before
    page = (root / "report" / "index.html").read_text()
    assert "3 unreadable line(s) of <code>metrics.jsonl</code> skipped" in page

    # a config.yaml nested too deep for YAML's recursive reader: that folder is left out, named
    (damaged / "config.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert main(["report", str(root), "--formats", "[png]"]) == 2
    assert "config.yaml is nested too deeply to read" in capsys.readouterr().err


def test_sweep_dry_run_counts_run_folders_it_cannot_read_and_resumes_a_deep_summary(tmp_path, capsys):
    path = write_sweep(tmp_path, {"seed": {"values": [0]}, "data.classes_per_client": {"value": 4}})
    runs = tmp_path / "runs"
    assert main(["sweep", str(path), "--", "--logger.mode", "disabled", "--logger.progress", "false",
                 "--federation.rounds", "1", "--federation.private_epochs_first", "1",
                 "--federation.public_epochs_first", "1", "--data.num_clients", "5", "--data.public_size", "100",
                 "--model.hidden", "[16]", "--logger.run_dir", str(runs)]) == 0
    (run,) = [p for p in runs.iterdir() if p.is_dir() and p.name != ".sweep"]
    (run / "summary.json").write_text(DEEP_SUMMARY)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(DEEP_LINE)
    other = runs / "copied"
    shutil.copytree(run, other)
    (other / "config.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    capsys.readouterr()
    assert main(["sweep", str(path), "--dry_run", "--", "--logger.mode", "disabled", "--logger.progress", "false",
                 "--federation.rounds", "1", "--federation.private_epochs_first", "1",
                 "--federation.public_epochs_first", "1", "--data.num_clients", "5", "--data.public_size", "100",
                 "--model.hidden", "[16]", "--logger.run_dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "fdlit sweep: 2 run folder(s) with a file fdlit could not read" in out
    assert "copied (config.yaml is nested too deeply to read" in out
    assert f"{run.name} (summary.json is nested deeper than 64 levels" in out
    assert "1 combinations, 0 finished, 1 to run (1 resumed in their own folder)" in out
    assert f"resume ({run})" in out


def test_resume_rebuilds_a_log_with_a_deep_line_from_the_checkpoint(fast_args, tmp_path, capsys):
    assert main(["fit", *fast_args]) == 0
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    rows = read_jsonl(run / "metrics.jsonl")
    with open(run / "metrics.jsonl", "a") as f:
        f.write(DEEP_LINE)  # a complete line (it ends in a newline): damage, not a torn write
    capsys.readouterr()
    assert main(["fit", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert "metrics.jsonl was damaged (unreadable line(s) 3); rebuilt from the checkpoint (2 rows up to round 2)" in err
    assert read_jsonl(run / "metrics.jsonl") == rows
    (kept,) = run.glob("metrics.jsonl.damaged-*")
    assert kept.read_text().endswith(DEEP_LINE)
    # a deep summary: the run is resumed all the same, and its summary written again
    (run / "summary.json").write_text(DEEP_SUMMARY)
    assert main(["fit", "--resume", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["finished"] is True
    assert yaml.safe_load((run / "config.yaml").read_text())["federation"]["rounds"] == 2
