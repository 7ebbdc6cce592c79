"""``python -m fdlit report <runs dir>``: reads the runs, builds Table 1 and the figures, and writes
them with the page (what each part is: :mod:`fdlit.reporting`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fdlit.errors import ConfigError
from fdlit.reporting.adversaries import adversaries_figures
from fdlit.reporting.figures import (
    accuracy_vs_epsilon,
    accuracy_vs_tau,
    bytes_total,
    chi_vs_k,
    curves,
    figure2,
    trust_figures,
)
from fdlit.reporting.labels import LOCAL_LABEL, REF_LABEL
from fdlit.reporting.page import page_html
from fdlit.reporting.paper_figures import FORMATS, check_formats, paper_style, save_figure
from fdlit.reporting.runs import ACC, LOCAL, _k_sort, _method_sort, load_runs
from fdlit.reporting.table import TIED_MARK, table1, table1_caption
from fdlit.reporting.table_files import markdown_text, table1_csv, table1_latex, table1_markdown
from fdlit.runs.atomic_write import enclosing_run_directory, is_run_directory, write_file


def write_report(runs_dir: str | Path, out: str | Path | None = None, include_unfinished: bool = False,
                 say: Callable[[str], None] = print, include_duplicates: bool = False,
                 formats: tuple[str, ...] = FORMATS) -> Path:
    """Write the report of the runs under ``runs_dir`` into ``out``; ``formats``: the figure files
    (``pdf``, ``svg``, ``png``; the PNG is always written, the page shows it). The page's path back."""
    formats = check_formats(formats)
    out = check_out(Path(out) if out else default_out(Path(runs_dir)))
    runs, skipped = load_runs(runs_dir, include_unfinished, include_duplicates)
    skipped = [(p.relative_to(runs_dir) if p.is_relative_to(runs_dir) else p, why) for p, why in skipped]
    if skipped:
        say(f"fdlit report: {len(runs)} run(s) used, {len(skipped)} left out: "
            + "; ".join(f"{p} ({why})" for p, why in skipped))
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for r in runs:
        bytes_total(r)
    table = table1(runs)
    selected = any(r.selected for r in runs)
    caption = table1_caption(table, selected)
    md_caption = table1_caption(table, selected, tied=f"marked {TIED_MARK}")
    best = "validation-selected" if selected else "best"  # what every accuracy of a table or figure is
    tables = {"table1.md": markdown_text(md_caption) + "\n\n" + table1_markdown(table), "table1.csv": table1_csv(table),
              "table1.tex": table1_latex(table, caption)}

    methods = sorted({r.method for r in runs}, key=_method_sort)
    ks = table.ks or sorted({r.k for r in runs}, key=_k_sort)
    with paper_style():
        drawn = [  # (file stem, caption, figure or None)
            ("figure2_accuracy_vs_k", f"Figure 2: {best} test accuracy vs classes per client k (mean ± std over "
             "seeds); dashed: local only, dotted: reference.", figure2(table)),
            ("appB_accuracy_curves", "App. B: mean global (top) and local (bottom) test accuracy after the public "
             "phase vs round, one panel per k; shaded ±1 std over seeds.",
             curves(runs, methods, ks, [(ACC, "global accuracy (%)"), (LOCAL, "local accuracy (%)")])),
            ("accuracy_vs_tau", f"{best.capitalize()} test accuracy vs sUWA's temperature τ (τ = 0 is AVG, τ = 1 is UWA), one "
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
            ("privacy_accuracy_and_attack_vs_epsilon", f"Differential privacy on uploads: {best} test accuracy "
             "(left) and the membership-inference attack's AUC (right, the audit; 0.5 is chance) against the ε "
             "spent by the last round (mean ± std over seeds); dashed: the same rule without DP.",
             accuracy_vs_epsilon(runs)),
            ("accuracy_vs_bytes", "Mean global accuracy vs cumulative bytes sent (up + down, all clients), one "
             "panel per k.", curves(runs, methods, ks, [(ACC, "global accuracy (%)")], xkey="comm/bytes_total_mib",
                                    xlabel="cumulative MiB (up + down)")),
        ]
        drawn += adversaries_figures(runs)
        trust = [(stem, f"Who to trust ({caption}): mean weight each client gets on public samples of each true "
                  "class; a dot marks a client's own classes.", fig) for stem, caption, fig in trust_figures(runs)]
        figures = [(stem, caption, fig.get_figwidth(), save_figure(fig, out / "figures", stem, formats))
                   for stem, caption, fig in drawn + trust if fig is not None]
    trust_stems = {stem for stem, *_ in trust}
    page = page_html(runs, skipped, runs_dir, table, caption, figures, trust_stems, formats, selected)
    # the page first: the tables are never there without the page that says what they hold
    index = write_file(out / "index.html", page)
    for name, text in tables.items():
        write_file(out / name, text)
    return index


def default_out(runs_dir: Path) -> Path:
    """``<runs>/report``; beside a single run folder (``<run>-report``), whose files only its run writes."""
    enclosing = enclosing_run_directory(runs_dir)
    return runs_dir / "report" if enclosing is None else enclosing.parent / f"{enclosing.name}-report"


def check_out(out: Path) -> Path:
    """The report's folder: a folder or nothing yet, and not a run directory (its files are the run's)."""
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"must be a folder (or not exist yet), but {str(out)!r} is a file")
    enclosing = enclosing_run_directory(out)
    if enclosing is not None:
        where = "a run directory" if is_run_directory(out) else f"inside the run directory {str(enclosing)!r}"
        raise ConfigError("out", f"{str(out)!r} is {where}, whose files only its run writes; "
                          "choose another folder (by default <runs>/report)")
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError("out", f"{str(probe)!r} is not a folder you can write to; got {str(out)!r}")
    return out
