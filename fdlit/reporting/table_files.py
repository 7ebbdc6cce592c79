"""Table 1 as files: ``table1.md`` (Markdown), ``table1.csv`` (one line per cell) and ``table1.tex``
(booktabs).

Every text from a run (a dataset, a label, a k) is escaped for its file: in Markdown a ``|`` cannot
end a cell and ``<script>`` or ``<img onerror>`` stays text; in CSV a cell starting with ``=``,
``+``, ``-``, ``@``, a tab or a carriage return is prefixed with ``'`` (OWASP's advice against CSV
injection: a spreadsheet would run it as a formula); in LaTeX every special character is escaped;
a line break is a space in all three."""

from __future__ import annotations

import csv
import io
import re

from fdlit.reporting.labels import REF_LABEL
from fdlit.reporting.table import TIED_MARK, Stat, Table, _first_of_block, _row_cells, _show_dataset

CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
TAG_START = re.compile(r"<(?=[A-Za-z/!?])")  # what begins an HTML tag or comment; "p < 0.05" stays


def markdown_text(text) -> str:
    """Text for a Markdown table cell: shown as written, never a tag, never the end of the cell."""
    text = CONTROL.sub(" ", str(text)).replace("\\", "\\\\").replace("|", "\\|").replace("&", "&amp;")
    return TAG_START.sub("&lt;", text)


def csv_text(value):
    """A text cell a spreadsheet shows as text (OWASP, CSV injection); numbers as they are."""
    if not isinstance(value, str):
        return value
    return CONTROL.sub(" ", "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value)


def table1_markdown(table: Table) -> str:
    """Bold for the best of a column, † for tied (Markdown has no underline); a cell's n only when
    the cells' n differ (otherwise the caption says it once)."""
    with_n = len(table.seeds) > 1
    head = ["dataset"] * _show_dataset(table) + ["method"]
    head += [f"k={markdown_text(k)} {name}" for k in table.ks for _, name in table.phases]
    head += [REF_LABEL] * bool(table.ref) + ["selected by"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for i, (dataset, label, kind) in enumerate(table.rows):
        row = [markdown_text(dataset)] * _show_dataset(table)
        row.append(f"*{markdown_text(label)}*" if kind != "rule" else markdown_text(label))
        for _, _, stat, mark in _row_cells(table, dataset, label):
            if stat is None:
                row.append("–")
                continue
            text = {"best": f"**{stat.text()}**", "tied": f"{stat.text()}{TIED_MARK}"}.get(mark, stat.text())
            row.append(f"{text} (n={stat.n})" if with_n else text)
        if table.ref:
            ref = table.ref_for(dataset, label) if _first_of_block(table, i) else None
            row.append((f"{ref.text()} (n={ref.n})" if with_n else ref.text()) if ref else "")
        row.append(table.selection.get((dataset, label)) or "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def table1_csv(table: Table) -> str:
    """Long format: one line per cell, the Ref. values with k = ``all``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["dataset", "method", "kind", "k", "phase", "mean_acc_pct", "std_acc_pct", "n_seeds",
                     "best_in_column", "tied_for_best", "selected_by"])
    for dataset, label, kind in table.rows:
        for k, phase, stat, mark in _row_cells(table, dataset, label):
            if stat is not None:
                writer.writerow([csv_text(dataset), csv_text(label), kind, csv_text(k), phase, f"{stat.mean:.4f}",
                                 "" if stat.n < 2 else f"{stat.std:.4f}", stat.n, int(mark == "best"),
                                 int(mark == "tied"), table.selection.get((dataset, label), "")])
    for (dataset, group), stat in sorted(table.ref.items()):
        writer.writerow([csv_text(dataset), csv_text(group + REF_LABEL), "ref", "all", "public", f"{stat.mean:.4f}",
                         "" if stat.n < 2 else f"{stat.std:.4f}", stat.n, 0, 0, ""])
    return buf.getvalue()


LATEX_SPECIAL = {"_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}",
                 "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                 "τ": r"$\tau$", "±": r"$\pm$", "χ": r"$\chi$", "≥": r"$\geq$", "<": r"$<$", ">": r"$>$", "[": "{[}", "]": "{]}"}


def _latex(text: str) -> str:
    """Text for a LaTeX table: special characters escaped, the Greek letters as math, ASCII only."""
    out = "".join(LATEX_SPECIAL.get(c, c) for c in CONTROL.sub(" ", str(text)))
    return out.encode("ascii", "replace").decode()  # pdflatex-safe


def _k_latex(k) -> str:
    """``$k=2$``; a k that is not a number (``dir0.1``, anything from an edited config) as text."""
    return f"$k={k:g}$" if isinstance(k, (int, float)) and not isinstance(k, bool) else f"$k$={_latex(k)}"


def _latex_cell(stat: Stat, mark: str, with_n: bool) -> str:
    """``$m \\pm s$``, bold (``\\mathbf``) or underlined (tied), with its n when the n differ."""
    value = f"{stat.mean:.2f} \\pm {stat.std:.2f}" if stat.n > 1 else f"{stat.mean:.2f}"
    value = {"best": f"\\mathbf{{{value}}}", "tied": f"\\underline{{{value}}}"}.get(mark, value)
    return f"${value}$" + (f" ($n{{=}}{stat.n}$)" if with_n else "")


def table1_latex(table: Table, caption: str) -> str:
    """A booktabs ``tabular`` as in Kovalchuk et al. (2026) Table 1 (``\\usepackage{booktabs}``)."""
    show_dataset = _show_dataset(table)
    phases = table.phases
    lead = int(show_dataset) + 1
    with_n = len(table.seeds) > 1
    cols = "l" * lead + "c" * (len(phases) * len(table.ks)) + "c" * bool(table.ref) + "l"
    k_head = " & ".join(f"\\multicolumn{{{len(phases)}}}{{c}}{{{_k_latex(k)}}}" for k in table.ks)
    rules = " ".join(f"\\cmidrule(lr){{{lead + 1 + j * len(phases)}-{lead + (j + 1) * len(phases)}}}"
                     for j in range(len(table.ks)))
    ref_head = " & Ref." if table.ref else ""
    lines = [r"\begin{table}[t]", r"\centering", r"\small", f"\\caption{{{_latex(caption)}}}",
             f"\\begin{{tabular}}{{{cols}}}", r"\toprule",
             ("Dataset & " if show_dataset else "") + f"Method & {k_head}{ref_head} & Selected by \\\\"]
    if len(phases) > 1:
        phase_head = " & ".join(name for _ in table.ks for _, name in phases)
        lines += [rules, "&" * lead + f" {phase_head}" + (" &" if table.ref else "") + r" & \\"]
    lines.append(r"\midrule")
    for i, (dataset, label, kind) in enumerate(table.rows):
        row = [_latex(dataset)] * show_dataset + [f"\\textit{{{_latex(label)}}}" if kind != "rule" else _latex(label)]
        for _, _, stat, mark in _row_cells(table, dataset, label):
            row.append("--" if stat is None or not stat.finite else _latex_cell(stat, mark, with_n))
        if table.ref:
            ref = table.ref_for(dataset, label) if _first_of_block(table, i) else None
            row.append(_latex_cell(ref, "", with_n) if ref else "")
        row.append(table.selection.get((dataset, label)) or "--")
        lines.append(" & ".join(row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"



def legend_markdown(legend: dict[str, dict]) -> str:
    """The settings each group label of a table stands for (nothing when the table has no groups)."""
    if not legend:
        return ""
    keys = list(next(iter(legend.values())))
    lines = ["", "Groups: the settings in which this table's runs differ (other settings are shared).", "",
             "| group | " + " | ".join(markdown_text(k) for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for label, settings in legend.items():
        lines.append(f"| {markdown_text(label.strip())} | " + " | ".join(markdown_text(settings.get(k, ""))
                                                                       for k in keys) + " |")
    return "\n".join(lines) + "\n"


def measured_networks(runs) -> dict[str, str]:
    """Row label -> the network whose accuracy the row is, for the rows whose runs say so (one text
    per label: runs of one label that disagree are listed with both)."""
    seen: dict[str, list[str]] = {}
    for r in runs:
        if r.measured_network and r.measured_network not in seen.setdefault(r.method, []):
            seen[r.method].append(r.measured_network)
    return {label: " / ".join(texts) for label, texts in seen.items() if texts}


def networks_markdown(runs) -> str:
    networks = measured_networks(runs)
    if not networks:
        return ""
    return "\nNetwork measured: " + "; ".join(f"{markdown_text(label)}: {markdown_text(text)}"
                                               for label, text in networks.items()) + ".\n"
