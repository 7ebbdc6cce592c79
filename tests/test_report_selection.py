"""A report row is its runs' own: each run is selected by its own rule (validation-selected when it has
a validation set, else its best test round), and its row never changes with what else the folder holds."""

import shutil

import yaml

from fdlit.cli import main
from tests.fake_runs import fake_run, md_cells


def _with_validation(path, size=100):
    config = yaml.safe_load((path / "config.yaml").read_text())
    config["data"]["validation_size"] = size
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def _report(folder, capsys) -> tuple[str, list[str]]:
    assert main(["report", str(folder), "--formats", "[png]"]) == 0
    capsys.readouterr()
    out = folder / "report"
    return (out / "table1.md").read_text(), (out / "table1.csv").read_text().splitlines()


def test_a_runs_row_is_the_same_alone_and_beside_a_run_without_validation(tmp_path, capsys):
    alone = tmp_path / "alone"
    # the test accuracy peaks at 0.7 in round 2; the round of best validation accuracy (1) had 0.65
    run = _with_validation(fake_run(alone, "sUWA", 2, 0, 0.70, summary={
        "selected_global_acc_mean": 0.65, "selected_global_acc_mean_after_private": 0.55, "selected_round": 1}))
    md_alone, csv_alone = _report(alone, capsys)
    row = md_cells(md_alone, "sUWA τ=0.25")
    assert row == ["55.00", "65.00", "90.00", "validation"]  # personalized: the selected round's local accuracy

    mixed = tmp_path / "mixed"
    shutil.copytree(run, mixed / run.name)
    fake_run(mixed, "AVG", 2, 0, 0.50)  # no validation set: its own best test round
    md_mixed, csv_mixed = _report(mixed, capsys)
    assert md_cells(md_mixed, "sUWA τ=0.25") == row
    assert md_cells(md_mixed, "AVG") == ["40.00", "50.00", "75.00", "test"]
    assert [line for line in csv_mixed if ",sUWA τ=0.25," in line] == [line for line in csv_alone[1:]]
    assert md_alone.startswith("Validation-selected") and md_mixed.startswith("Validation-selected or best (per row)")


def test_runs_of_one_setting_selected_by_different_rules_are_never_pooled(tmp_path, capsys):
    root = tmp_path / "runs"
    fake_run(root, "AVG", 2, 0, 0.50, summary={"selected_global_acc_mean": 0.40})
    fake_run(root, "AVG", 2, 1, 0.60)  # its summary has no validation-selected number
    md, _ = _report(root, capsys)
    validation, test = md_cells(md, "AVG (validation-selected)"), md_cells(md, "AVG (test-best)")
    assert (validation[1], validation[-1]) == ("40.00", "validation") and (test[1], test[-1]) == ("60.00", "test")
