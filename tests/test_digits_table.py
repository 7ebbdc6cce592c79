"""scripts/digits_table.py: a progress line per finished run, and no made-up ``± 0.00`` for one seed."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import digits_table  # noqa: E402


def test_one_seed_has_no_std_and_several_have_the_sample_std():
    assert digits_table.cell([81.234]) == "81.23"
    assert digits_table.cell([80.0, 82.0]) == "81.00 ± 1.41"
    assert digits_table.cell([]) == "–"


def test_the_table_says_its_progress_and_its_spread(tmp_path, monkeypatch, capsys):
    def fake_run(out, name, k, seed, validation_size, extra, rules):
        acc = 0.5 + 0.01 * k + 0.001 * seed
        return {"best_global_acc_mean": acc, "best_global_acc_mean_after_private": acc - 0.1, "wall_time_s": 2.0,
                "run_dir": str(tmp_path)}

    monkeypatch.setattr(digits_table, "run_one", fake_run)
    monkeypatch.setattr(sys, "argv", ["digits_table.py", "--out", str(tmp_path), "--seeds", "0", "--ks", "2", "9",
                                      "--rules", "AVG", "UWA", "--budgets"])
    digits_table.main()
    out, err = capsys.readouterr()
    progress = [line for line in err.splitlines() if line.startswith("digits_table: [")]
    assert len(progress) == 4 and progress[-1].startswith("digits_table: [4/4]")
    assert "one seed, no std" in out and "±" not in out.split("\n", 1)[1]
    assert re.search(r"\| AVG \| 42\.00 \| 52\.00 \| 49\.00 \| 59\.00 \|", out), out
