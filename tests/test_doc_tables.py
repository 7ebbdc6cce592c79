"""scripts/doc_tables.py: the docs' example tables are marked, rendered from table1.csv as the doc shows
them, and a table that differs from a fresh run is reported as drift (exit 1) or rewritten (--write)."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("doc_tables", REPO / "scripts" / "doc_tables.py")
doc_tables = importlib.util.module_from_spec(spec)
sys.modules["doc_tables"] = doc_tables  # its dataclass looks its module up there
spec.loader.exec_module(doc_tables)


def csv_rows(avg_k2="46.7312"):
    rows = []
    for method in ("AVG", "UWA"):
        for k in ("2", "9", "10"):
            for phase in ("private", "public"):
                mean = avg_k2 if (method, k, phase) == ("AVG", "2", "public") else "50.0000"
                rows.append({"method": method, "kind": "rule", "k": k, "phase": phase, "mean_acc_pct": mean,
                             "std_acc_pct": "1.2345", "n_seeds": "2"})
    rows.append({"method": "AVG [ref]", "kind": "ref", "k": "all", "phase": "public", "mean_acc_pct": "99.0",
                 "std_acc_pct": "", "n_seeds": "1"})
    return rows


def test_the_table_is_the_after_public_cells_by_method_and_numeric_k():
    assert doc_tables.render(csv_rows(), "public") == (
        "| method | k=2 | k=9 | k=10 |\n|---|---|---|---|\n"
        "| AVG | 46.73 ± 1.23 | 50.00 ± 1.23 | 50.00 ± 1.23 |\n"
        "| UWA | 50.00 ± 1.23 | 50.00 ± 1.23 | 50.00 ± 1.23 |\n")


def test_every_example_has_its_marked_table_in_its_doc():
    for example in doc_tables.EXAMPLES:
        body = doc_tables.blocks((REPO / example.doc).read_text())[example.name]
        assert body.startswith("| method | k=") and body.count("\n") >= 3, example.name
        assert (REPO / example.sweep).is_file()


def test_drift_fails_and_write_rewrites(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "page.md"
    doc.write_text("before\n<!-- doc_table: digits_quick -->\n" + doc_tables.render(csv_rows(), "public")
                   + "<!-- /doc_table -->\nafter\n")
    monkeypatch.setattr(doc_tables, "REPO", tmp_path)
    monkeypatch.setattr(doc_tables, "EXAMPLES", [doc_tables.Example("digits_quick", "page.md", "s.yaml", "public")])
    fresh = {"rows": csv_rows()}
    monkeypatch.setattr(doc_tables, "generate", lambda example, jobs, folder: doc_tables.render(fresh["rows"],
                                                                                                  "public"))
    assert doc_tables.main([]) == 0 and "is current" in capsys.readouterr().out
    fresh["rows"] = csv_rows(avg_k2="48.1000")
    assert doc_tables.main([]) == 1
    assert "+| AVG | 48.10 ± 1.23" in capsys.readouterr().out
    assert "46.73" in doc.read_text()  # a check never writes
    assert doc_tables.main(["--write"]) == 0
    text = doc.read_text()
    assert "48.10" in text and "46.73" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert doc_tables.main([]) == 0
