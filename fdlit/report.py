"""``python -m fdlit report <runs dir>``: the paper's tables and figures from local run directories.

Reads ``config.yaml``, ``metrics.jsonl`` and ``summary.json`` of every run under the folder (no W&B
needed) and writes ``<out>/index.html`` (self-contained: figures inlined as PNG data URIs; every
value from a run escaped, and a Content-Security-Policy that allows no script and no request),
``<out>/figures/<name>.{pdf,svg,png}`` (see :mod:`fdlit.paper_figures`: one- or two-column paper
size, text >= 8 pt, no in-plot titles, the captions are in the page) and Table 1 as ``table1.md``,
``table1.csv`` and ``table1.tex`` (booktabs, cells ``$m \\pm s$``):

- a settings header: what all runs share, what varies, the seeds, which metric the table holds;
- Table 1 in the layout of Kovalchuk et al. (2026, Table 1): a row per rule, a column per k, each
  split into the best accuracy after the private and after the public phase, mean ± std over seeds
  (no std with n = 1); the fully informed reference (``federation.mode: reference``) in its own
  ``Ref.`` column and the no-communication baseline (``local_only``) in its own row, neither ever
  marked; a column (phase, Ref., dataset) with nothing to show is left out. Rows are named by what
  they are: sUWA at τ = 0 is AVG, at τ = 1 UWA.
- The bold rule: a column's best rule is bold only when it beats the second best by Welch's t-test
  over seeds (unequal variances, two-sided, p < 0.05, at least 3 seeds each); otherwise every rule
  the test does not show to be worse than the best is underlined as tied for best.
- Figure 2: best accuracy vs k (Kovalchuk et al. 2026, Fig. 2); accuracy vs sUWA's τ; χ vs k;
- App. B curves: mean global and local accuracy vs round, shaded ±1 std over seeds
  (Kovalchuk et al. 2026, App. B.1); χ vs round; accuracy vs cumulative bytes (up + down);
- the last round's who-to-trust matrix of every rule, k and seed, each client's own classes boxed,
  in files named by the run (``trust_<run directory>``).

"Best" is the best round's mean over clients (``summary.json``; the metrics when it lacks it). When a
run's summary holds a validation-selected accuracy (``selected_global_acc_mean``), that one is used
instead, and the header says so. Std is the sample std over seeds (n-1). Each (setting, seed) counts
once: when several run directories hold the same config (a sweep run again, a run copied), the
finished one with the most rounds is used and the others are listed as left out, with the reason
(``include_duplicates`` keeps them all); unfinished runs are left out unless ``include_unfinished``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import io
import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fdlit.data.federated import DEFAULT_CLASSES_PER_CLIENT
from fdlit.errors import ConfigError
from fdlit.paper_figures import (
    FORMATS,
    MIN_FONT_PT,
    ONE_COLUMN_IN,
    PNG_DPI,
    TWO_COLUMN_IN,
    check_formats,
    legend_below,
    method_colors,
    new_figure,
    paper_style,
    plain_text,
    save_figure,
)
from fdlit.run_labels import (
    LOCAL_LABEL,
    REF_LABEL,
    _flatten,
    _number,
    _section,
    method_label,
    run_kind,
    setting_key,
    suwa_tau,
)
from fdlit.runs.checkpoint import without_noop_sections
from fdlit.runs.dashboards import TRUST_KEY, TRUST_MAX_ROWS
from fdlit.runs.directory import METRICS, read_config, read_jsonl, read_summary, safe_name

ACC = "after_public/global_acc_mean"
PRIVATE_ACC = "after_private/global_acc_mean"
LOCAL = "after_public/local_acc_mean"
SELECTED = "selected_global_acc_mean"  # validation-selected accuracy, when the run's summary has one
ORDER = {"AVG": 0, "UWA": 1, "sUWA": 2}
PHASES = (("private", "after private"), ("public", "after public"))


@dataclass
class Run:
    path: Path
    config: dict
    metrics: list[dict]
    summary: dict
    method: str = ""
    k: Any = None  # classes per client (int) or a label such as "dir0.1"
    seed: int = 0
    kind: str = "rule"  # "rule" (federated distillation), "local" (local_only) or "ref" (reference)
    dataset: str = ""
    group: str = ""  # the settings this run differs in from others of its dataset, e.g. "[rounds=5] "
    # validation-selected numbers are used only when every run has them: one table never mixes
    # them with test-best numbers (set by load_runs)
    use_selected: bool = False

    @property
    def finished(self) -> bool:
        return bool(self.summary.get("finished"))

    @property
    def has_selected(self) -> bool:
        return _number(self.summary.get(SELECTED)) is not None

    @property
    def selected(self) -> bool:
        return self.use_selected and self.has_selected

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        rows = [(m["round"], m[key]) for m in self.metrics if m.get(key) is not None]
        return np.array([r for r, _ in rows], dtype=float), np.array([v for _, v in rows], dtype=float)

    def best(self, phase: str = "public") -> float:
        """Best mean global accuracy (fraction) after the ``private`` or ``public`` phase."""
        keys = ((SELECTED, "best_global_acc_mean") if phase == "public"
                else (SELECTED + "_after_private", "best_global_acc_mean_after_private"))
        keys = keys if self.selected else keys[1:]
        for key in keys:
            value = _number(self.summary.get(key))
            if value is not None:
                return value
        _, acc = self.series(ACC if phase == "public" else PRIVATE_ACC)
        return float(np.nanmax(acc)) if len(acc) else math.nan

    def last(self, key: str) -> float | None:
        _, values = self.series(key)
        return float(values[-1]) if len(values) else None


def load_runs(root: str | Path, include_unfinished: bool = False,
              include_duplicates: bool = False) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Runs under ``root`` (any depth), one per (setting, seed) unless ``include_duplicates``, and the
    run directories left out with the reason (unreadable, unfinished, or the same setting and seed
    as a run that is used)."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError("runs", f"{str(root)!r} is not a folder")
    candidates, skipped = [], []
    for path in sorted(p.parent for p in root.rglob(METRICS)):
        try:
            config = read_config(path)
        except (OSError, yaml.YAMLError):
            skipped.append((path, "config.yaml unreadable"))
            continue
        try:
            summary = read_summary(path)
        except (OSError, json.JSONDecodeError):
            summary = {}
        run = Run(path, config if isinstance(config, dict) else {}, read_jsonl(path / METRICS),
                  summary if isinstance(summary, dict) else {})
        if not run.metrics:
            skipped.append((path, "no metrics"))
            continue
        if not (run.finished or include_unfinished):
            skipped.append((path, "unfinished"))
            continue
        candidates.append(run)
    # one run per (setting, seed): finished first, then the most rounds, then the newest folder
    runs, used = [], {}
    newest_first = sorted(candidates, key=lambda r: r.path.name, reverse=True)
    for run in sorted(newest_first, key=lambda r: (not r.finished, -len(r.metrics))):
        key = setting_key(run.config)
        if key in used and not include_duplicates:
            skipped.append((run.path, f"same setting and seed as {used[key].name}"))
            continue
        used.setdefault(key, run.path)
        data = _section(run.config, "data")
        run.method, run.kind = method_label(run.config), run_kind(run.config)
        run.dataset = str(data.get("dataset", ""))
        run.k = ((data.get("classes_per_client") or DEFAULT_CLASSES_PER_CLIENT)
                 if data.get("partition", "classes") == "classes" else f"dir{data.get('dirichlet_alpha')}")
        run.seed = run.config.get("seed", 0)
        # a hand-edited config may hold anything: the table's keys must be plain values
        run.k = run.k if isinstance(run.k, (int, float, str)) else str(run.k)
        run.seed = run.seed if isinstance(run.seed, (int, float, str)) else str(run.seed)
        run.summary["client_classes"] = _client_classes(run.summary.get("client_classes"))
        runs.append(run)
    runs.sort(key=lambda r: r.path)
    if not runs:
        raise ConfigError("runs", f"no {'' if include_unfinished else 'finished '}run directories "
                          f"(config.yaml + metrics.jsonl) under {str(root)!r}"
                          + ("" if include_unfinished else "; --include_unfinished uses unfinished ones"))
    # runs that differ in anything but the studied knobs (e.g. two sweeps with different rounds in
    # one folder) are never pooled: the differing settings become part of the row label. Compared
    # within a dataset: each dataset has its own model and schedule, as in the paper's Table 1.
    for dataset in {r.dataset for r in runs}:
        group = [r for r in runs if r.dataset == dataset]
        flat = [_flatten(without_noop_sections(r.config)) for r in group]  # a no-op section is no difference
        differing = _differing(flat)
        for r, f in zip(group, flat, strict=True):
            if differing:
                r.group = "[" + ", ".join(f"{k.rsplit('.', 1)[-1]}={f.get(k)}" for k in differing) + "] "
                r.method = r.group + r.method
    every = all(r.has_selected for r in runs)
    for r in runs:
        r.use_selected = every
    return runs, skipped


STUDIED = ("seed", "logger.", "checkpoint.", "aggregator", "data.classes_per_client", "data.dirichlet_alpha",
           "federation.mode")


def _differing(flat: list[dict[str, Any]]) -> list[str]:
    return sorted(k for k in set().union(*flat)
                  if not k.startswith(STUDIED) and len({repr(f.get(k)) for f in flat}) > 1)


def shared_settings(runs: list[Run]) -> tuple[dict[str, Any], list[str]]:
    """(settings every run has in common, the keys that vary), without run names and folders."""
    flat = [_flatten(r.config) for r in runs]
    keys = sorted(set().union(*flat))
    shared = {k: flat[0].get(k) for k in keys
              if not k.startswith(("logger.", "checkpoint.")) and len({repr(f.get(k)) for f in flat}) == 1}
    varying = [k for k in keys if k not in shared and not k.startswith(("logger.", "checkpoint."))]
    # a rule's own knobs vary with the rule: "aggregator" says it once
    varying = sorted({"aggregator" if k.startswith("aggregator.") and k != "aggregator.init_args.tau" else k
                      for k in varying})
    return shared, varying


def _client_classes(value: Any) -> list[list[int]] | None:
    """The summary's ``client_classes`` when it is a list of lists of class indices, else None."""
    if isinstance(value, list) and all(isinstance(c, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                   for i in c) for c in value):
        return value
    return None


def _k_sort(k: Any) -> tuple:
    return (0, k, "") if isinstance(k, (int, float)) else (1, 0, str(k))


def _method_sort(m: str) -> tuple:
    prefix, _, label = m.rpartition("] ")
    base = label.split(" ")[0]  # AVG, UWA, sUWA first, in the paper's order; the local baseline last
    return (prefix, 10 if label == LOCAL_LABEL else ORDER.get(base, 9), m)


# ------------------------------------------------------------------------------------------ Table 1
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


BOLD_RULE = (f"Bold: the best rule of a column, only when it beats the second best by Welch's t-test over seeds "
             f"(two-sided, p < {ALPHA:g}, n ≥ {MIN_SEEDS} seeds each); otherwise every rule not shown worse than "
             "the best by that test is underlined (tied for best).")


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
    for r in runs:
        if r.kind == "ref":  # one model on all classes: its k is meaningless, so it is pooled over k
            refs[(r.dataset, r.group)].append(r.best("public"))
            continue
        groups[(r.dataset, r.method, r.kind, r.k)].append(r)
        group_of[(r.dataset, r.method)] = r.group
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
    bold, tied = set(), set()
    for dataset, group in {(d, group_of[(d, m)]) for d, m, _ in rows}:
        rules = [m for d, m, kind in rows if d == dataset and kind == "rule" and group_of[(d, m)] == group]
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
    return Table(rows, ks, cells, {key: Stat.of(v) for key, v in refs.items()}, group_of, bold, tied)


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


def table1_caption(table: Table, selected: bool) -> str:
    what = "Validation-selected (selected_global_acc_mean)" if selected else "Best"
    datasets = sorted({d for d, _, _ in table.rows if d})
    on = f" on {', '.join(datasets)}" if datasets and not _show_dataset(table) else ""
    after = ("after the private and after the public phase" if len(table.phases) > 1
             else f"{table.phases[0][1] if table.phases else 'after public'} phase")
    seeds = f"n = {next(iter(table.seeds))} seeds per cell" if len(table.seeds) == 1 else "n seeds per cell as shown"
    parts = [f"{what} mean global test accuracy (%){on} {after}, mean ± std over seeds ({seeds}; no std with n = 1).",
             BOLD_RULE]
    if table.ref:
        parts.append("Ref.: fully informed reference.")
    if any(kind == "local" for _, _, kind in table.rows):
        parts.append("Local only: no communication (baselines are never marked).")
    if any("(sUWA τ=" in label for _, label, _ in table.rows):
        parts.append("sUWA with τ = 0 is AVG and with τ = 1 is UWA.")
    return " ".join(parts)


def table1_markdown(table: Table) -> str:
    head = ["dataset"] * _show_dataset(table) + ["method"]
    head += [f"k={k} {name}" for k in table.ks for _, name in table.phases] + [REF_LABEL] * bool(table.ref)
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for i, (dataset, label, kind) in enumerate(table.rows):
        row = [dataset] * _show_dataset(table) + [f"*{label}*" if kind != "rule" else label]
        for _, _, stat, mark in _row_cells(table, dataset, label):
            if stat is None:
                row.append("–")
                continue
            text = {"best": f"**{stat.text()}**", "tied": f"<u>{stat.text()}</u>"}.get(mark, stat.text())
            row.append(f"{text} (n={stat.n})")
        if table.ref:
            ref = table.ref_for(dataset, label) if _first_of_block(table, i) else None
            row.append(f"{ref.text()} (n={ref.n})" if ref else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def table1_html(table: Table) -> str:
    show_dataset = _show_dataset(table)
    phases = table.phases
    head1 = ('<th rowspan="2">dataset</th>' if show_dataset else "") + '<th rowspan="2">method</th>'
    head1 += "".join(f'<th colspan="{len(phases)}">k={html.escape(str(k))}</th>' for k in table.ks)
    if table.ref:
        head1 += (f'<th rowspan="2" class="ref" title="fully informed reference (federation.mode: reference)">'
                  f"{REF_LABEL}</th>")
    head2 = "".join(f'<th class="phase">{name}</th>' for _ in table.ks for _, name in phases)
    body = []
    for i, (dataset, label, kind) in enumerate(table.rows):
        tds = []
        for _, phase, stat, mark in _row_cells(table, dataset, label):
            if stat is None:
                tds.append("<td>–</td>")
                continue
            text = html.escape(stat.text())
            text = {"best": f"<b>{text}</b>", "tied": f'<u title="tied for best">{text}</u>'}.get(mark, text)
            tds.append(f'<td class="{phase}">{text} <span class="n">n={stat.n}</span></td>')
        if table.ref:
            ref = table.ref_for(dataset, label) if _first_of_block(table, i) else None
            tds.append(f'<td class="ref">{html.escape(ref.text())} <span class="n">n={ref.n}</span></td>' if ref
                       else '<td class="ref"></td>')
        row_class = ' class="baseline"' if kind != "rule" else ""
        dataset_cell = f"<th>{html.escape(dataset)}</th>" if show_dataset else ""
        body.append(f"<tr{row_class}>{dataset_cell}<th>{html.escape(label)}</th>{''.join(tds)}</tr>")
    return (f'<table id="table1"><thead><tr>{head1}</tr><tr>{head2}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def table1_csv(table: Table) -> str:
    """Long format: one line per cell, the Ref. values with k = ``all``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["dataset", "method", "kind", "k", "phase", "mean_acc_pct", "std_acc_pct", "n_seeds",
                     "best_in_column", "tied_for_best"])
    for dataset, label, kind in table.rows:
        for k, phase, stat, mark in _row_cells(table, dataset, label):
            if stat is not None:
                writer.writerow([dataset, label, kind, k, phase, f"{stat.mean:.4f}",
                                 "" if stat.n < 2 else f"{stat.std:.4f}", stat.n, int(mark == "best"),
                                 int(mark == "tied")])
    for (dataset, group), stat in sorted(table.ref.items()):
        writer.writerow([dataset, group + REF_LABEL, "ref", "all", "public", f"{stat.mean:.4f}",
                         "" if stat.n < 2 else f"{stat.std:.4f}", stat.n, 0, 0])
    return buf.getvalue()


LATEX_SPECIAL = {"_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}",
                 "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                 "τ": r"$\tau$", "±": r"$\pm$", "χ": r"$\chi$", "≥": r"$\geq$", "<": r"$<$", ">": r"$>$", "[": "{[}", "]": "{]}"}


def _latex(text: str) -> str:
    """Text for a LaTeX table: special characters escaped, the Greek letters as math, ASCII only."""
    out = "".join(LATEX_SPECIAL.get(c, c) for c in str(text))
    return out.encode("ascii", "replace").decode()  # pdflatex-safe


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
    cols = "l" * lead + "c" * (len(phases) * len(table.ks)) + "c" * bool(table.ref)
    k_head = " & ".join(f"\\multicolumn{{{len(phases)}}}{{c}}{{$k={_latex(str(k))}$}}" for k in table.ks)
    rules = " ".join(f"\\cmidrule(lr){{{lead + 1 + j * len(phases)}-{lead + (j + 1) * len(phases)}}}"
                     for j in range(len(table.ks)))
    ref_head = " & Ref." if table.ref else ""
    lines = [r"\begin{table}[t]", r"\centering", r"\small", f"\\caption{{{_latex(caption)}}}",
             f"\\begin{{tabular}}{{{cols}}}", r"\toprule",
             ("Dataset & " if show_dataset else "") + f"Method & {k_head}{ref_head} \\\\"]
    if len(phases) > 1:
        phase_head = " & ".join(name for _ in table.ks for _, name in phases)
        lines += [rules, "&" * lead + f" {phase_head}" + (" &" if table.ref else "") + r" \\"]
    lines.append(r"\midrule")
    for i, (dataset, label, kind) in enumerate(table.rows):
        row = [_latex(dataset)] * show_dataset + [f"\\textit{{{_latex(label)}}}" if kind != "rule" else _latex(label)]
        for _, _, stat, mark in _row_cells(table, dataset, label):
            row.append("--" if stat is None or not stat.finite else _latex_cell(stat, mark, with_n))
        if table.ref:
            ref = table.ref_for(dataset, label) if _first_of_block(table, i) else None
            row.append(_latex_cell(ref, "", with_n) if ref else "")
        lines.append(" & ".join(row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- figures
def _style(method: str) -> dict[str, Any]:
    """Baselines dashed, so they are never read as one more rule."""
    return {"linestyle": "--"} if method.endswith((LOCAL_LABEL, REF_LABEL)) else {}


def _mean_curve(runs: list[Run], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    by_round: dict[float, list[float]] = defaultdict(list)
    for r in runs:
        for x, v in zip(*r.series(key), strict=True):
            by_round[x].append(v)
    xs = np.array(sorted(by_round))
    mean = np.array([np.mean(by_round[x]) for x in xs])
    std = np.array([np.std(by_round[x], ddof=1) if len(by_round[x]) > 1 else 0.0 for x in xs])
    return xs, mean, std


def _single_panel(fig, ax, xlabel: str, ylabel: str, xticks=None):
    """Label, grid and legend a one-panel figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if xticks is not None:
        ax.set_xticks(xticks)
    ax.grid(alpha=0.3)
    legend_below(fig, ax)
    return fig


def _labels(table: Table) -> list[str]:
    """Row labels across datasets (the dataset prefixes the label when there are several)."""
    several = len({d for d, _, _ in table.rows}) > 1
    return [f"{d}: {m}" if several else m for d, m, _ in table.rows]


def _one_panel():
    """A one-column figure of one panel (the legend, under it, adds its height)."""
    return new_figure(1, width=ONE_COLUMN_IN, panel_aspect=0.72)


def figure2(table: Table):
    """Best accuracy vs k (Kovalchuk et al. 2026, Fig. 2), one column wide."""
    numeric = [k for k in table.ks if isinstance(k, (int, float))]
    if not numeric:
        return None
    fig, axes = _one_panel()
    ax = axes[0, 0]
    labels = _labels(table)
    colors = method_colors(labels)
    for (dataset, m, kind), label in zip(table.rows, labels, strict=True):
        pts = [(k, table.cells[(dataset, m, k, "public")].mean, table.cells[(dataset, m, k, "public")].std)
               for k in numeric if (dataset, m, k, "public") in table.cells]
        if pts:
            x, y, e = map(np.array, zip(*pts, strict=True))
            ax.errorbar(x, y, yerr=np.nan_to_num(e), marker="o", capsize=2, label=label, color=colors[label],
                        **_style(m))
    for (dataset, group), stat in table.ref.items():
        ax.axhline(stat.mean, color="gray", linestyle=":", label=f"{group}{REF_LABEL} (all classes)")
    return _single_panel(fig, ax, "classes per client k", "test accuracy (%)", numeric)


def accuracy_vs_tau(runs: list[Run]):
    """sUWA's best accuracy vs its temperature τ, one line per k (AVG is τ = 0, UWA τ = 1)."""
    points: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        tau = suwa_tau(r.config) if r.kind == "rule" else None
        if tau is not None:
            points[(r.dataset, r.group, r.k)][tau].append(100 * r.best("public"))
    if not points or all(len(by_tau) < 2 for by_tau in points.values()):
        return None  # one τ only: nothing to plot against
    fig, axes = _one_panel()
    ax = axes[0, 0]
    for (dataset, group, k), by_tau in sorted(points.items(), key=lambda kv: (kv[0][0], kv[0][1], _k_sort(kv[0][2]))):
        taus = sorted(by_tau)
        mean = np.array([np.mean(by_tau[t]) for t in taus])
        std = np.array([np.std(by_tau[t], ddof=1) if len(by_tau[t]) > 1 else 0.0 for t in taus])
        ax.errorbar(taus, mean, yerr=std, marker="o", capsize=2, label=f"{dataset} {group}k={k}".strip())
    return _single_panel(fig, ax, "sUWA temperature τ", "best test accuracy (%)")


def privacy_label(run: Run) -> str:
    """The run's rule (without the block prefix) and, unless full logits, its upload encoding."""
    encoding = (_section(run.config, "privacy").get("encoding") or "full")
    return run.method.split("] ")[-1] + ("" if encoding == "full" else f" ({encoding})")


def accuracy_vs_epsilon(runs: list[Run]):
    """Best accuracy and membership-attack AUC (``privacy/mia_auc``, the audit) against the ε spent
    by the last round (``privacy/epsilon``); runs without DP drawn as dashed horizontal lines."""
    dp: dict[tuple, dict[float, list[tuple[float, float | None]]]] = defaultdict(lambda: defaultdict(list))
    plain: dict[tuple, list[tuple[float, float | None]]] = defaultdict(list)
    for r in runs:
        if r.kind != "rule":
            continue
        eps, auc = r.last("privacy/epsilon"), r.last("privacy/mia_auc")
        auc = auc if auc is not None and math.isfinite(auc) else None
        key = (r.dataset, privacy_label(r), r.k)
        if eps is not None and math.isfinite(eps):
            dp[key][float(f"{eps:.6g}")].append((100 * r.best("public"), auc))
        else:
            plain[key].append((100 * r.best("public"), auc))
    if not dp:
        return None  # no run spent a privacy budget: nothing to plot against
    fig, axes = new_figure(2, width=TWO_COLUMN_IN, panel_aspect=0.8)
    colors = method_colors(sorted({key for key in list(dp) + list(plain)}, key=str))
    for col, (index, ylabel) in enumerate(((0, "best test accuracy (%)"), (1, "membership attack AUC"))):
        ax = axes[0, col]
        for key, by_eps in sorted(dp.items(), key=lambda kv: str(kv[0])):
            eps = sorted(by_eps)
            values = [[v[index] for v in by_eps[e] if v[index] is not None] for e in eps]
            shown = [(e, v) for e, v in zip(eps, values, strict=True) if v]
            if shown:
                ax.errorbar([e for e, _ in shown], [np.mean(v) for _, v in shown],
                            yerr=[np.std(v, ddof=1) if len(v) > 1 else 0.0 for _, v in shown], marker="o",
                            capsize=2, color=colors[key], label=f"{key[1]} k={key[2]}")
        for key, values in sorted(plain.items(), key=lambda kv: str(kv[0])):
            v = [x[index] for x in values if x[index] is not None]
            if v:
                ax.axhline(np.mean(v), ls="--", lw=1, color=colors.get(key, "grey"),
                           label=f"{key[1]} k={key[2]}, no DP")
        if index == 1:
            ax.axhline(0.5, ls=":", lw=1, color="black", label="chance")
        ax.set_xscale("log")
        ax.set_xlabel("ε after the last round (log)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    legend_below(fig, axes[0, 1])
    return fig


def chi_vs_k(runs: list[Run], table: Table):
    """Weight concentration χ of the last round vs k, mean ± std over seeds, one line per rule."""
    numeric = [k for k in table.ks if isinstance(k, (int, float))]
    labels = _labels(table)
    colors = method_colors(labels)
    fig, axes = _one_panel()
    ax = axes[0, 0]
    drawn = False
    for (dataset, m, kind), label in zip(table.rows, labels, strict=True):
        pts = []
        for k in numeric:
            chis = [c for r in runs if (r.dataset, r.method, r.k) == (dataset, m, k)
                    for c in [r.last("weights/chi")] if c is not None]
            if chis:
                pts.append((k, np.mean(chis), np.std(chis, ddof=1) if len(chis) > 1 else 0.0))
        if kind == "rule" and pts:
            x, y, e = map(np.array, zip(*pts, strict=True))
            ax.errorbar(x, y, yerr=e, marker="o", capsize=2, label=label, color=colors[label])
            drawn = True
    if not drawn:
        return None
    return _single_panel(fig, ax, "classes per client k", "χ (last round)", numeric)


def curves(runs: list[Run], methods, ks, panels: list[tuple[str, str]], xkey: str | None = None,
           xlabel: str = "round"):
    """One column per k (its x label names the k), one row per (metric, label); a line per method,
    shaded ±1 std. The reference (trained on every class) is drawn in every column. Two columns of
    a paper wide (one with a single k)."""
    from matplotlib.ticker import MaxNLocator

    width = ONE_COLUMN_IN if len(ks) == 1 else TWO_COLUMN_IN
    fig, axes = new_figure(len(ks), len(panels), width=width, panel_aspect=0.8 if len(ks) > 1 else 0.6)
    colors = method_colors(methods)
    for col, k in enumerate(ks):
        for row, (key, label) in enumerate(panels):
            ax = axes[row, col]
            for m in methods:
                group = [r for r in runs if r.method == m and (r.k == k or r.kind == "ref")]
                if not group:
                    continue
                xs, mean, std = _mean_curve(group, key)
                if not len(xs):
                    continue
                if xkey is not None:  # e.g. cumulative bytes at each round, averaged over seeds
                    _, x_mean, _ = _mean_curve(group, xkey)
                    n = min(len(xs), len(x_mean))
                    xs, mean, std = x_mean[:n], mean[:n], std[:n]
                scale = 100.0 if "acc" in key else 1.0  # accuracies in %, as in Table 1
                mean, std = mean * scale, std * scale
                ax.plot(xs, mean, marker=".", label=m, color=colors[m], **_style(m))
                ax.fill_between(xs, mean - std, mean + std, alpha=0.2, color=colors[m], linewidth=0)
            ax.set_xlabel(plain_text(f"{xlabel}, k = {k}"))
            if xkey is None:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if col == 0:
                ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    legend_below(fig, axes[0, 0])
    return fig


def bytes_total(run: Run) -> None:
    """Adds ``comm/bytes_total_mib`` (up + down, cumulative) to every round of a run."""
    for m in run.metrics:
        up, down = m.get("comm/up_bytes_total"), m.get("comm/down_bytes_total")
        m["comm/bytes_total_mib"] = None if up is None or down is None else (up + down) / 2**20


def trust_figures(runs: list[Run]) -> list[tuple[str, str, Any]]:
    """(file stem named by the run, caption, figure): the last-round who-to-trust matrix of every run
    that logged one (every rule, k and seed), each client's own classes boxed where the run recorded
    them (``client_classes`` in its summary). One column wide."""
    from fdlit.runs.dashboards import draw_trust_heatmap

    out = []
    for r in sorted(runs, key=lambda r: (r.dataset, _method_sort(r.method), _k_sort(r.k), str(r.seed))):
        last = next((row for row in reversed(r.metrics) if row.get(TRUST_KEY)), None)
        if last is None:
            continue
        classes = r.summary.get("client_classes")
        title = f"{r.dataset + ' ' if r.dataset else ''}{r.method}, k={r.k}, seed {r.seed}, round {last['round']}"
        caption = title + ("" if classes else " (own classes not recorded by this run: no boxes)")
        rows = min(len(last[TRUST_KEY]), TRUST_MAX_ROWS)
        fig, axes = new_figure(1, width=ONE_COLUMN_IN, panel_aspect=min(2.2, 0.35 + 0.055 * rows))
        try:
            draw_trust_heatmap(fig, axes[0, 0], last[TRUST_KEY], classes or None)
        except (TypeError, ValueError):  # a metrics line someone edited: no matrix to draw
            continue
        _thin_ticks(axes[0, 0])
        out.append((f"trust_{safe_name(r.path.name)}", caption, fig))
    return out


def _thin_ticks(ax, most_x: int = 10, most_y: int = 20) -> None:
    """At most ``most_x`` / ``most_y`` tick labels (every n-th): e.g. CIFAR-100's classes at 8 pt
    need room at one column's width."""
    for axis, most in ((ax.xaxis, most_x), (ax.yaxis, most_y)):
        ticks = list(axis.get_ticklocs())
        labels = [t.get_text() for t in axis.get_ticklabels()]
        if len(ticks) > most:
            step = math.ceil(len(ticks) / most)
            axis.set_ticks(ticks[::step], labels[::step] if all(labels) else None)


# ------------------------------------------------------------------------------------------- page
CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child{text-align:left}tbody th{text-align:left}thead th{text-align:center}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:0.9em;max-width:900px}code{background:#f4f4f4;padding:0 3px}
.n{color:#888;font-size:0.75em}th.phase{font-weight:normal;font-size:0.85em;color:#555}
tr.baseline th,tr.baseline td{font-style:italic;background:#fafafa}td.ref,th.ref{background:#f3f6fa}
#settings td,#settings th{text-align:left;font-size:0.9em}#runs td:nth-child(-n+2){text-align:left}
u{text-decoration-style:dotted;text-underline-offset:3px}
figure.one img{width:495px}figure.two img{width:1035px}
.trust{display:flex;flex-wrap:wrap;gap:8px}.trust figure{margin:0;max-width:495px}"""


def content_security_policy() -> str:
    """Nothing but this page's own stylesheet and its inlined PNGs: no script, no request, no form."""
    style = base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()
    return (f"default-src 'none'; img-src data:; style-src 'sha256-{style}'; script-src 'none'; "
            "base-uri 'none'; form-action 'none'")


def settings_html(runs: list[Run], skipped, runs_dir) -> str:
    shared, varying = shared_settings(runs)
    seeds = sorted({r.seed for r in runs}, key=str)
    selected = sum(r.selected for r in runs)
    metric = ("the best round's mean global test accuracy over clients" if not selected else
              f"<b>validation-selected</b> accuracy (<code>{SELECTED}</code>; every run has a validation set)")
    kinds = {kind: sum(r.kind == kind for r in runs) for kind in ("rule", "local", "ref")}
    items = [
        ("runs", f"{len(runs)} from <code>{html.escape(str(runs_dir))}</code> ({kinds['rule']} federated distillation, "
                 f"{kinds['local']} local only, {kinds['ref']} reference)"
                 + (f"; {len(skipped)} left out (listed below)" if skipped else "")),
        ("seeds", html.escape(", ".join(map(str, seeds))) + f" (n = {len(seeds)})"),
        ("Table 1 holds", metric),
        ("varies", html.escape(", ".join(varying)) or "nothing"),
    ]
    head = "".join(f"<tr><th>{name}</th><td>{text}</td></tr>" for name, text in items)
    rows = "".join(f"<tr><th><code>{html.escape(k)}</code></th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in shared.items())
    return (f'<table id="settings">{head}</table>'
            f"<details><summary>settings all {len(runs)} run(s) share ({len(shared)})</summary>"
            f'<table id="shared">{rows}</table></details>')


def _formats_text(formats) -> str:
    vector = [f.upper() for f in ("pdf", "svg") if f in formats]
    return (f"vector {' and '.join(vector)} and a " if vector else "a ") + f"{PNG_DPI}-dpi PNG"


def _percent(value: float) -> str:
    return f"{100 * value:.2f}" if math.isfinite(value) else "–"


def write_report(runs_dir: str | Path, out: str | Path | None = None, include_unfinished: bool = False,
                 say: Callable[[str], None] = print, include_duplicates: bool = False,
                 formats: tuple[str, ...] = FORMATS) -> Path:
    """Write the report of the runs under ``runs_dir`` into ``out``; ``formats``: the figure files
    (``pdf``, ``svg``, ``png``; the PNG is always written, the page shows it). The page's path back."""
    formats = check_formats(formats)
    out = Path(out) if out else Path(runs_dir) / "report"
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"must be a folder (or not exist yet), but {str(out)!r} is a file")
    runs, skipped = load_runs(runs_dir, include_unfinished, include_duplicates)
    skipped = [(p.relative_to(runs_dir) if p.is_relative_to(runs_dir) else p, why) for p, why in skipped]
    if skipped:
        say(f"fdlit report: {len(runs)} run(s) used, {len(skipped)} left out: "
            + "; ".join(f"{p} ({why})" for p, why in skipped))
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for r in runs:
        bytes_total(r)
    table = table1(runs)
    caption = table1_caption(table, any(r.selected for r in runs))
    (out / "table1.md").write_text(caption + "\n\n" + table1_markdown(table), encoding="utf-8")
    (out / "table1.csv").write_text(table1_csv(table), encoding="utf-8")
    (out / "table1.tex").write_text(table1_latex(table, caption), encoding="utf-8")

    methods = sorted({r.method for r in runs}, key=_method_sort)
    ks = table.ks or sorted({r.k for r in runs}, key=_k_sort)
    with paper_style():
        drawn = [  # (file stem, caption, figure or None)
            ("figure2_accuracy_vs_k", "Figure 2: best test accuracy vs classes per client k (mean ± std over "
             "seeds); dashed: local only, dotted: reference.", figure2(table)),
            ("appB_accuracy_curves", "App. B: mean global (top) and local (bottom) test accuracy after the public "
             "phase vs round, one panel per k; shaded ±1 std over seeds.",
             curves(runs, methods, ks, [(ACC, "global accuracy (%)"), (LOCAL, "local accuracy (%)")])),
            ("accuracy_vs_tau", "Best test accuracy vs sUWA's temperature τ (τ = 0 is AVG, τ = 1 is UWA), one "
             "line per k (mean ± std over seeds).", accuracy_vs_tau(runs)),
        ]
        if any(m.get("weights/chi") is not None for r in runs for m in r.metrics):
            drawn += [
                ("chi_vs_k", "Weight concentration χ = E_x Σ_i W[i,x]² of the last round vs k (1/M for AVG; "
                 "mean ± std over seeds).", chi_vs_k(runs, table)),
                ("chi_vs_round", "Weight concentration χ vs round, one panel per k (1/M for AVG).",
                 curves(runs, [m for m in methods if not m.endswith((LOCAL_LABEL, REF_LABEL))], ks,
                        [("weights/chi", "χ")])),
            ]
        drawn += [
            ("privacy_accuracy_and_attack_vs_epsilon", "Differential privacy on uploads: best test accuracy "
             "(left) and the membership-inference attack's AUC (right, the audit; 0.5 is chance) against the ε "
             "spent by the last round (mean ± std over seeds); dashed: the same rule without DP.",
             accuracy_vs_epsilon(runs)),
            ("accuracy_vs_bytes", "Mean global accuracy vs cumulative bytes sent (up + down, all clients), one "
             "panel per k.", curves(runs, methods, ks, [(ACC, "global accuracy (%)")], xkey="comm/bytes_total_mib",
                                    xlabel="cumulative MiB (up + down)")),
        ]
        from fdlit.report_adversaries import adversaries_figures  # it builds on this module's helpers

        drawn += adversaries_figures(runs)
        trust = [(stem, f"Who to trust ({caption}): mean weight each client gets on public samples of each true "
                  "class; a client's own classes boxed.", fig) for stem, caption, fig in trust_figures(runs)]
        figures = [(stem, caption, fig.get_figwidth(), save_figure(fig, out / "figures", stem, formats))
                   for stem, caption, fig in drawn + trust if fig is not None]
    trust_stems = {stem for stem, *_ in trust}

    run_rows = "".join(
        f"<tr><td>{html.escape(r.path.name)}</td><td>{html.escape(r.method)}</td><td>{html.escape(str(r.k))}</td>"
        f"<td>{html.escape(str(r.seed))}</td><td>{len(r.metrics)}</td><td>{'yes' if r.finished else 'no'}</td>"
        f"<td>{_percent(r.best('private'))}</td><td>{_percent(r.best('public'))}</td>"
        f"<td>{'yes' if r.selected else 'no'}</td></tr>"
        for r in sorted(runs, key=lambda r: (r.dataset, _method_sort(r.method), _k_sort(r.k), str(r.seed))))

    def figure_html(items):
        out_html = []
        for stem, caption, width, png in items:
            size = "one" if width <= ONE_COLUMN_IN + 0.01 else "two"
            files = ", ".join(f"<code>figures/{html.escape(stem)}.{fmt}</code>" for fmt in FORMATS
                              if fmt in formats or fmt == "png")
            out_html.append(
                f'<figure class="{size}"><img src="data:image/png;base64,{base64.b64encode(png).decode()}" '
                f'alt="{html.escape(stem)}"><figcaption>{html.escape(caption)} {files} '
                f"({width:g} in wide: {size} column{'s' if size == 'two' else ''})</figcaption></figure>")
        return "".join(out_html)

    flags = "<code>--include_unfinished</code> uses unfinished ones, <code>--include_duplicates</code> keeps copies"
    note = (f"<p>{len(skipped)} run(s) left out ({flags}):</p><ul>"
            + "".join(f"<li><code>{html.escape(str(p))}</code>: {html.escape(why)}</li>" for p, why in skipped)
            + "</ul>" if skipped else "")
    trust_figs = [f for f in figures if f[0] in trust_stems]
    trust_html = (f'<h2>Who to trust</h2><div class="trust">{figure_html(trust_figs)}</div>' if trust_figs else "")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{content_security_policy()}">
<meta name="referrer" content="no-referrer">
<title>fdlit report: {html.escape(str(runs_dir))}</title>
<style>{CSS}</style></head><body>
<h1>fdlit report</h1>
<p>{len(runs)} run(s) from <code>{html.escape(str(runs_dir))}</code>.</p>
<h2>Settings</h2>
{settings_html(runs, skipped, runs_dir)}
{note}
<h2>Table 1: best test accuracy (%)</h2>
<p>{html.escape(caption)} Also as <code>table1.md</code>, <code>table1.csv</code>, <code>table1.tex</code> (booktabs).</p>
{table1_html(table)}
<h2>Figures</h2>
<p>Each figure as {_formats_text(formats)}, sized for a one-column ({ONE_COLUMN_IN:g} in) or
two-column ({TWO_COLUMN_IN:g} in) paper figure, text at least {MIN_FONT_PT} pt at that size.</p>
{figure_html([f for f in figures if f[0] not in trust_stems])}
{trust_html}
<h2>Runs</h2>
<table id="runs"><thead><tr><th>run</th><th>method</th><th>k</th><th>seed</th><th>rounds</th><th>finished</th>
<th>best acc after private (%)</th><th>best acc after public (%)</th><th>validation-selected</th></tr></thead>
<tbody>{run_rows}</tbody></table>
</body></html>
"""
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
