"""No command writes anywhere inside a run folder that is not its own: not at its top, not in a
folder under it (export --out, report --out, a sweep's runs and results)."""

from __future__ import annotations

import yaml

from fdlit.cli import main


def a_run(folder):
    """A run folder as fdlit recognises one (its config and a file a run writes)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("seed: 0\n")
    (folder / "metrics.jsonl").write_text('{"round": 1}\n')
    return folder


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_export_never_writes_into_a_folder_inside_a_run(tmp_path, capsys):
    run = a_run(tmp_path / "run")
    (run / "sub" / "deeper").mkdir(parents=True)
    before = listing(run)
    for out in (run / "sub" / "m.pt", run / "sub" / "deeper" / "m.pt"):
        assert main(["export", str(run), "--client", "0", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"fdlit: error: out: {str(out)!r} is inside the run directory {str(run.resolve())!r}, whose "
                       "files only its run writes; write it somewhere else"]
    assert listing(run) == before


def test_report_never_writes_into_a_folder_inside_a_run(tmp_path, capsys):
    runs = tmp_path / "runs"
    run = a_run(runs / "r1")
    before = listing(run)
    assert main(["report", str(runs), "--out", str(run / "rep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: out: {str(run / 'rep')!r} is inside the run directory")
    assert listing(run) == before


def test_a_sweep_never_puts_its_runs_inside_a_run(tmp_path, capsys):
    run = a_run(tmp_path / "run")
    before = listing(run)
    spec = {"name": "tiny", "method": "grid", "parameters": {"seed": {"values": [0]}},
            "command": ["${env}", "${interpreter}", "-m", "fdlit", "fit", "--config", "digits.yaml", "${args}"]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(tmp_path / "s.yaml"), "--", "--logger.run_dir", str(run / "sweeps"),
                 "--logger.mode", "disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: logger.run_dir: ") and "inside the run directory" in err[0]
    assert listing(run) == before
