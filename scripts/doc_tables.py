"""Regenerate the docs' example tables from their committed commands, or check that they have not drifted.

    python scripts/doc_tables.py            # run each example's sweep and report, exit 1 where a doc differs
    python scripts/doc_tables.py --write    # the same, and write the fresh tables into the docs
    python scripts/doc_tables.py --jobs 2 --only digits_quick

A doc marks each generated table with ``<!-- doc_table: NAME -->`` ... ``<!-- /doc_table -->``; EXAMPLES
below says which sweep file makes it and which of ``table1.csv``'s cells it shows. Each example runs its
sweep into a fresh folder (`fdlit sweep FILE --jobs N -- --logger.run_dir DIR --logger.mode disabled`),
then `fdlit report DIR`, and renders the table from ``DIR/report/table1.csv``. Runs are seeded, so a
table that changes says that fdlit's numbers changed: the docs are rewritten in the same commit or the
change is a bug.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Example:
    name: str
    doc: str  # relative to the repository
    sweep: str
    phase: str  # table1.csv's phase column: "public" (after public) or "private"


EXAMPLES = [Example("digits_quick", "docs/sweeps-and-reports.md", "sweeps/digits_quick.yaml", "public")]
BLOCK = re.compile(r"(<!-- doc_table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /doc_table -->)", re.S)


def render(rows: list[dict], phase: str) -> str:
    """The Markdown table of ``phase``'s cells: one row per method (in the report's order), one column per k."""
    cells = [r for r in rows if r["phase"] == phase and r["kind"] != "ref"]
    methods = list(dict.fromkeys(r["method"] for r in cells))
    ks = sorted({r["k"] for r in cells}, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else k))
    value = {(r["method"], r["k"]): r for r in cells}
    lines = ["| method | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for m in methods:
        out = []
        for k in ks:
            r = value.get((m, k))
            if r is None:
                out.append("")
            else:
                std = f" ± {float(r['std_acc_pct']):.2f}" if r["std_acc_pct"] else ""
                out.append(f"{float(r['mean_acc_pct']):.2f}{std}")
        lines.append(f"| {m} | " + " | ".join(out) + " |")
    return "\n".join(lines) + "\n"


def blocks(text: str) -> dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def replace_block(text: str, name: str, body: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + body + m.group(4) if m["name"] == name else m.group(0), text)


def generate(example: Example, jobs: int, folder: Path) -> str:
    python = [sys.executable, "-m", "fdlit"]
    subprocess.run([*python, "sweep", str(REPO / example.sweep), "--jobs", str(jobs), "--",
                    "--logger.run_dir", str(folder), "--logger.mode", "disabled", "--logger.progress", "false"],
                   cwd=REPO, check=True)
    subprocess.run([*python, "report", str(folder)], cwd=REPO, check=True)
    with open(folder / "report" / "table1.csv", newline="") as f:
        return render(list(csv.DictReader(f)), example.phase)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the fresh tables into the docs")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="example names (default: all)")
    args = parser.parse_args(argv)
    drift = 0
    for example in EXAMPLES:
        if args.only and example.name not in args.only:
            continue
        doc = REPO / example.doc
        text = doc.read_text()
        if example.name not in blocks(text):
            print(f"{example.doc}: no <!-- doc_table: {example.name} --> block", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            fresh = generate(example, args.jobs, Path(tmp))
        old = blocks(text)[example.name]
        if fresh == old:
            print(f"{example.name}: {example.doc} is current")
            continue
        drift += 1
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), fresh.splitlines(True),
                                                   f"{example.doc} (committed)", f"{example.name} (fresh run)"))
        if args.write:
            doc.write_text(replace_block(text, example.name, fresh))
            print(f"{example.name}: {example.doc} rewritten")
    return 0 if args.write or not drift else 1


if __name__ == "__main__":
    sys.exit(main())
