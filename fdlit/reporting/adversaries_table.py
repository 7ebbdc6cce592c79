"""The adversaries table (docs/adversaries.md): per attack, a row per rule and a column per share of
attackers, each cell the honest clients' mean global accuracy at the last evaluated round (%, mean ± std
over seeds) and, in brackets, the attackers' total weight in the teacher or the global model
(``adversaries/weight``, mean over seeds; "–" where the rule reports none). The same points as the
adversaries figures (:mod:`fdlit.reporting.adversaries`): 0 % is the same setting without attackers."""

from __future__ import annotations

import csv
import html
import io
import math

import numpy as np

from fdlit.reporting.adversaries import Line, attack_lines
from fdlit.reporting.measure_table import cell_text
from fdlit.reporting.table_files import csv_text, markdown_text

CAPTION = ("Per attack: the honest clients' mean global test accuracy (%) at the last evaluated round, mean ± std "
           "over seeds, and in brackets the attackers' total weight in the teacher or the global model "
           "(adversaries/weight, mean over seeds; – where the rule reports none), against the share of clients "
           "that attack (0 %: the same setting without attackers).")


def _values(by_seed: dict) -> list[float]:
    return [v for v in by_seed.values() if math.isfinite(v)]


def adversaries_table(runs: list) -> list[tuple[str, list[float], list[Line]]]:
    """(attack label, shares of attackers, the rules' lines) per attack, in the figures' order."""
    out = []
    for _, (label, lines) in sorted(attack_lines(runs).items(), key=lambda kv: kv[1][0]):
        shares = sorted({x for line in lines for x in line.acc})
        out.append((label, shares, lines))
    return out


def share_text(x: float) -> str:
    return f"{100 * x:.4g} %"


def cell(line: Line, x: float) -> str:
    acc = [100 * v for v in _values(line.acc.get(x, {}))]
    weight = _values(line.weight.get(x, {}))
    if not acc:
        return "–"
    return cell_text(acc, 1) + (f" ({np.mean(weight):.2f})" if weight else " (–)")


def adversaries_markdown(table) -> str:
    parts = []
    for label, shares, lines in table:
        head = ["rule", *(share_text(x) for x in shares)]
        rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        rows += ["| " + " | ".join([markdown_text(line.label), *(cell(line, x) for x in shares)]) + " |"
                 for line in lines]
        parts.append(f"### Attack {markdown_text(label)}\n\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def adversaries_csv(table) -> str:
    """One line per (attack, rule, share): accuracy mean, std (empty with one seed), n, weight mean (empty: none)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["attack", "rule", "attackers", "honest_accuracy_mean", "honest_accuracy_std", "n",
                     "attackers_weight_mean"])
    for label, shares, lines in table:
        for line in lines:
            for x in shares:
                acc, weight = _values(line.acc.get(x, {})), _values(line.weight.get(x, {}))
                if acc:
                    writer.writerow([csv_text(label), csv_text(line.label), x, 100 * float(np.mean(acc)),
                                     100 * float(np.std(acc, ddof=1)) if len(acc) > 1 else "", len(acc),
                                     float(np.mean(weight)) if weight else ""])
    return out.getvalue()


def adversaries_html(table) -> str:
    parts = []
    for label, shares, lines in table:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in ["rule", *(share_text(x) for x in shares)])
        body = "".join(f"<tr><th>{html.escape(line.label)}</th>"
                       + "".join(f"<td>{html.escape(cell(line, x))}</td>" for x in shares) + "</tr>" for line in lines)
        parts.append(f"<h4>Attack {html.escape(label)}</h4>"
                     f'<table class="adversaries"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
    return "".join(parts)
