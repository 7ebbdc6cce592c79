"""Table 1 of Kovalchuk et al. (2026): a row per rule, a column per k and phase, mean ± std over
seeds, and the bold rule (Welch's t-test over seeds). Its files are written by
:mod:`fdlit.reporting.table_files`, its HTML by :mod:`fdlit.reporting.page`."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from fdlit.reporting.labels import REF_LABEL
from fdlit.reporting.runs import PHASES, Run, _k_sort, _method_sort, selection

ALPHA = 0.05  # significance level of the bold rule
MIN_SEEDS = 3  # fewer seeds than this: no test, so no bold


@dataclass
class Stat:
    mean: float  # %
    std: float  # %, sample std over seeds; nan with one seed
    n: int
    values: tuple = ()  # the per-seed values (%), for the significance test

    @staticmethod
    def of(values: list[float]) -> Stat:
        v = 100 * np.array(values, dtype=float)
        return Stat(float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else math.nan, len(v), tuple(v.tolist()))

    @property
    def finite(self) -> bool:
        return math.isfinite(self.mean)

    def text(self) -> str:
        if not self.finite:
            return "–"  # the runs have no such measurement (e.g. no evaluation after the private phase)
        return f"{self.mean:.2f} ± {self.std:.2f}" if self.n > 1 else f"{self.mean:.2f}"


def beats(a: Stat, b: Stat) -> bool:
    """Whether ``a`` is better than ``b`` by Welch's t-test (unequal variances, two-sided, p < ALPHA)
    over seeds, both with at least MIN_SEEDS seeds. With no spread in either (every seed the same),
    the higher mean wins."""
    if a.n < MIN_SEEDS or b.n < MIN_SEEDS or not (a.finite and b.finite) or not a.mean > b.mean:
        return False
    if a.std == 0 and b.std == 0:
        return True
    from scipy.stats import ttest_ind

    p = float(ttest_ind(a.values, b.values, equal_var=False).pvalue)
    return math.isfinite(p) and p < ALPHA


TIED_MARK = "†"  # table1.md's mark of "tied for best" (Markdown has no underline)


def bold_rule(tied: str = "underlined") -> str:
    """How the best and the tied cells are marked; ``tied``: how a tied cell is shown."""
    return (f"Bold: the best rule of a column, only when it beats the second best by Welch's t-test over seeds "
            f"(two-sided, p < {ALPHA:g}, n ≥ {MIN_SEEDS} seeds each); otherwise every rule not shown worse than "
            f"the best by that test is {tied} (tied for best).")


BOLD_RULE = bold_rule()


@dataclass
class Table:
    """Kovalchuk et al. (2026) Table 1: rows (dataset, method, kind), columns k x phase, a Ref. column."""
    rows: list[tuple[str, str, str]]  # (dataset, label, kind), kind "rule" or "local"
    ks: list
    cells: dict  # (dataset, label, k, phase) -> Stat
    ref: dict  # (dataset, group) -> Stat over all reference runs of that block (any k), after the public phase
    group_of: dict  # (dataset, label) -> group prefix
    bold: set  # (dataset, label, k, phase): the best rule of its block and column, by the test (BOLD_RULE)
    tied: set = frozenset()  # (dataset, label, k, phase): tied for the best of its column (no clear winner)
    # (dataset, label) -> how its runs' rounds were chosen, "validation" or "test" (each run by its own rule)
    selection: dict = field(default_factory=dict)

    @property
    def phases(self) -> list[tuple[str, str]]:
        """The phases with at least one measured cell: no column is empty."""
        return [(p, name) for p, name in PHASES
                if any(s.finite for (_, _, _, phase), s in self.cells.items() if phase == p)]

    @property
    def seeds(self) -> set[int]:
        """The numbers of seeds of the cells (one value: the caption says it once)."""
        return {s.n for s in [*self.cells.values(), *self.ref.values()]}

    def ref_for(self, dataset: str, label: str) -> Stat | None:
        return self.ref.get((dataset, self.group_of[(dataset, label)]))

    def mark(self, key: tuple) -> str:
        """"best", "tied" or ""."""
        return "best" if key in self.bold else "tied" if key in self.tied else ""


def table1(runs: list[Run]) -> Table:
    groups: dict[tuple, list[Run]] = defaultdict(list)
    refs: dict[tuple, list[float]] = defaultdict(list)
    group_of = {}
    by_row: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        if r.kind == "ref":  # one model on all classes: its k is meaningless, so it is pooled over k
            refs[(r.dataset, r.group)].append(r.best("public"))
            continue
        groups[(r.dataset, r.method, r.kind, r.k)].append(r)
        group_of[(r.dataset, r.method)] = r.group
        by_row[(r.dataset, r.method)].append(r)
    cells = {}
    for (dataset, label, _, k), group in groups.items():
        for phase, _ in PHASES:
            cells[(dataset, label, k, phase)] = Stat.of([r.best(phase) for r in group])
    rows = sorted({(d, m, kind) for d, m, kind, _ in groups}, key=lambda row: (row[0], _method_sort(row[1])))
    for dataset, group in refs:  # a block with only reference runs still gets a row to show them on
        if not any(d == dataset and group_of.get((d, m)) == group for d, m, _ in rows):
            rows.append((dataset, group + REF_LABEL, "ref"))
            group_of[(dataset, group + REF_LABEL)] = group
    ks = sorted({k for *_, k in groups}, key=_k_sort)
    rule_of = {key: selection(rs) if rs else "" for key, rs in by_row.items()}
    bold, tied = set(), set()
    # marks compare rules of one block whose numbers were selected alike (a test-best number is
    # optimistic beside a validation-selected one), so a row's marks never depend on the other rule's rows
    for dataset, group, rule in {(d, group_of[(d, m)], rule_of.get((d, m), "")) for d, m, _ in rows}:
        rules = [m for d, m, kind in rows if d == dataset and kind == "rule" and group_of[(d, m)] == group
                 and rule_of.get((d, m), "") == rule]
        if len(rules) < 2:
            continue  # marks compare several rules, never a baseline
        for k in ks:
            for phase, _ in PHASES:
                scored = sorted(((cells[(dataset, m, k, phase)], m) for m in rules
                                 if (dataset, m, k, phase) in cells and cells[(dataset, m, k, phase)].finite),
                                key=lambda sm: -sm[0].mean)
                if len(scored) < 2:
                    continue
                (top, best), (second, _) = scored[0], scored[1]
                if beats(top, second):
                    bold.add((dataset, best, k, phase))
                else:
                    tied |= {(dataset, m, k, phase) for stat, m in scored if not beats(top, stat)}
    return Table(rows, ks, cells, {key: Stat.of(v) for key, v in refs.items()}, group_of, bold, tied,
                 {(d, m): rule_of.get((d, m), "") for d, m, _ in rows})


def _first_of_block(table: Table, i: int) -> bool:
    dataset, label, _ = table.rows[i]
    if i == 0:
        return True
    prev_dataset, prev_label, _ = table.rows[i - 1]
    return (prev_dataset, table.group_of[(prev_dataset, prev_label)]) != (dataset, table.group_of[(dataset, label)])


def _show_dataset(table: Table) -> bool:
    """A dataset column only when the table holds several (one dataset is named in the caption)."""
    return len({d for d, _, _ in table.rows}) > 1


def _row_cells(table: Table, dataset: str, label: str):
    """A row's cells in column order: (k, phase, Stat or None for an empty cell, mark)."""
    for k in table.ks:
        for phase, _ in table.phases:
            key = (dataset, label, k, phase)
            yield k, phase, table.cells.get(key), table.mark(key)


# how a table's numbers were selected, each run by its own rule (column "selected by")
SELECTION_RULES = {
    "validation": "Selection (column \"selected by\"): each run's round of best validation accuracy (every run of "
                  "this table has a validation set).",
    "test": "Selection (column \"selected by\"): each run's round of best test accuracy (no run of this table has "
            "a validation set).",
    "mixed": "Selection (column \"selected by\"), each run by its own rule: validation: the round of best "
             "validation accuracy (the run has a validation set, selected_global_acc_mean); test: the round of "
             "best test accuracy (the run has none).",
}


def table_selection(table: Table) -> str:
    """``validation``, ``test`` or ``mixed``: how the rows' numbers of this table were chosen."""
    rules = {rule for rule in table.selection.values() if rule}
    return rules.pop() if len(rules) == 1 else "mixed" if rules else "test"


def table1_caption(table: Table, tied: str = "underlined") -> str:
    """The caption; ``tied``: how the file shows a cell tied for best (``marked †`` in Markdown)."""
    rule_name = table_selection(table)
    what = {"validation": "Validation-selected (selected_global_acc_mean)", "test": "Best",
            "mixed": "Validation-selected or best (per row)"}[rule_name]
    rule = SELECTION_RULES[rule_name]
    datasets = sorted({d for d, _, _ in table.rows if d})
    on = f" on {', '.join(datasets)}" if datasets and not _show_dataset(table) else ""
    seeds = f"n = {next(iter(table.seeds))} seeds per cell" if len(table.seeds) == 1 else "n seeds per cell as shown"
    global_phases = [p for p in table.phases if p[0] != "personalized"]
    after = ("after the private and after the public phase" if len(global_phases) > 1
             else f"{global_phases[0][1] if global_phases else 'after public'} phase")
    parts = [f"{what} mean global test accuracy (%){on} {after}, mean ± std over seeds ({seeds}; no std with n = 1).",
             rule, bold_rule(tied)]
    if any(p == "personalized" for p, _ in table.phases):
        parts.insert(1, "Personalized: the mean over clients of each client's test accuracy on its own classes, "
                     "after the public phase (at the selected round, else the best), as personalization papers report.")
    if table.ref:
        parts.append("Ref.: fully informed reference.")
    if any(kind == "local" for _, _, kind in table.rows):
        parts.append("Local only: no communication (baselines are never marked).")
    if any("(sUWA τ=" in label for _, label, _ in table.rows):
        parts.append("sUWA with τ = 0 is AVG and with τ = 1 is UWA.")
    return " ".join(parts)

