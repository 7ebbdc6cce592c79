"""Tables with a row per method and k and a column per measurement, mean ± std over seeds, written as
Markdown, CSV (one line per cell) and HTML: the bytes table (:mod:`fdlit.reporting.bytes_table`), the
round-budget table (:mod:`fdlit.reporting.budget_table`) and the privacy table
(:mod:`fdlit.reporting.privacy_table`)."""

from __future__ import annotations

import csv
import html
import io
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fdlit.reporting.runs import ACC, Run, _k_sort, _method_sort
from fdlit.reporting.table_files import csv_text, markdown_text

# (column name, how a run gives its number (None: not measured), decimals)
Column = tuple[str, Callable[[Run], "float | None"], int]


@dataclass
class MeasureTable:
    columns: list[tuple[str, int]]  # (name, decimals) of the columns some run measured
    rows: list[tuple[str, object]]  # (method label, k)
    cells: dict  # (label, k, column name) -> per-seed values


def evaluated_accuracy(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, mean global accuracy after the public phase) of the rounds that were evaluated."""
    rounds, acc = run.series(ACC)
    finite = np.isfinite(acc)
    return rounds[finite], acc[finite]


def measure_table(runs: list[Run], columns: list[Column]) -> MeasureTable | None:
    """The table of ``runs`` (the fully informed reference, one pooled model, has no k and no row);
    None when no run measured any column."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        if r.kind != "ref":
            groups[(r.method, r.k)].append(r)
    cells, used = {}, []
    for name, value, decimals in columns:
        any_value = False
        for key, group in groups.items():
            values = [v for v in (value(r) for r in group) if v is not None and math.isfinite(v)]
            cells[(*key, name)] = values
            any_value |= bool(values)
        if any_value:
            used.append((name, decimals))
    if not used:
        return None
    rows = sorted(groups, key=lambda row: (_method_sort(row[0]), _k_sort(row[1])))
    return MeasureTable(used, rows, cells)


def cell_text(values: list[float], decimals: int) -> str:
    """mean ± sample std over seeds; one seed has no std; nothing measured is a dash."""
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{decimals}f}"
    return f"{np.mean(values):.{decimals}f} ± {np.std(values, ddof=1):.{decimals}f}"


def measure_markdown(table: MeasureTable) -> str:
    head = ["method", "k", *(name for name, _ in table.columns)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, k in table.rows:
        row = [markdown_text(label), markdown_text(k)]
        row += [cell_text(table.cells[(label, k, name)], decimals) for name, decimals in table.columns]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def measure_csv(table: MeasureTable) -> str:
    """One line per (method, k, column): mean, std (empty with one seed) and the number of seeds."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["method", "k", "column", "mean", "std", "n"])
    for label, k in table.rows:
        for name, _ in table.columns:
            values = table.cells[(label, k, name)]
            if values:
                std = float(np.std(values, ddof=1)) if len(values) > 1 else ""
                writer.writerow([csv_text(label), csv_text(str(k)), name, float(np.mean(values)), std, len(values)])
    return out.getvalue()


def measure_html(table: MeasureTable, table_id: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["method", "k", *(n for n, _ in table.columns)])
    body = "".join(
        f"<tr><th>{html.escape(label)}</th><td>{html.escape(str(k))}</td>"
        + "".join(f"<td>{html.escape(cell_text(table.cells[(label, k, n)], d))}</td>" for n, d in table.columns)
        + "</tr>" for label, k in table.rows)
    return f'<table id="{html.escape(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
