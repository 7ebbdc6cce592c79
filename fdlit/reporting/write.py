"""``python -m fdlit report <runs dir>``: reads the runs, builds Table 1 and the figures, and writes
them with the page (what each part is: :mod:`fdlit.reporting`)."""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from pathlib import Path

from fdlit.errors import ConfigError
from fdlit.reporting.adversaries import adversaries_figures
from fdlit.reporting.adversaries_table import CAPTION as ADVERSARIES_CAPTION
from fdlit.reporting.adversaries_table import adversaries_csv, adversaries_html, adversaries_markdown, adversaries_table
from fdlit.reporting.budget_table import budget_table
from fdlit.reporting.budget_table import caption as budget_caption
from fdlit.reporting.bytes_table import CAPTION as BYTES_CAPTION
from fdlit.reporting.bytes_table import bytes_table
from fdlit.reporting.figures import (
    accuracy_vs_epsilon,
    accuracy_vs_tau,
    bytes_total,
    chi_vs_k,
    curves,
    figure2,
    trust_figures,
    upload_attacks_vs_epsilon,
)
from fdlit.reporting.groups import regroup
from fdlit.reporting.labels import LOCAL_LABEL, REF_LABEL
from fdlit.reporting.measure_table import measure_csv, measure_html, measure_markdown
from fdlit.reporting.page import SectionPage, page_html
from fdlit.reporting.paper_figures import FORMATS, check_formats, paper_style, save_figure
from fdlit.reporting.privacy_table import CAPTION as PRIVACY_CAPTION
from fdlit.reporting.privacy_table import privacy_table
from fdlit.reporting.runs import ACC, LOCAL, _k_sort, _method_sort, accuracy_words, load_runs
from fdlit.reporting.table import TIED_MARK, table1, table1_caption, table_selection
from fdlit.reporting.table_files import (
    legend_markdown,
    markdown_text,
    networks_markdown,
    table1_csv,
    table1_latex,
    table1_markdown,
)
from fdlit.runs.atomic_write import enclosing_run_directory, is_run_directory, write_file

VIRTUAL_TIME = "time/virtual_s"  # the server's virtual clock at each release (federation.clock)


def write_report(runs_dir: str | Path | list, out: str | Path | None = None, include_unfinished: bool = False,
                 say: Callable[[str], None] = print, include_duplicates: bool = False,
                 formats: tuple[str, ...] = FORMATS, budgets: list[int] = ()) -> Path:
    """Write the report of the runs under ``runs_dir`` (a folder, or a list of folders and run
    directories) into ``out``; ``formats``: the figure files (``pdf``, ``svg``, ``png``; the PNG is
    always written, the page shows it); ``budgets``: round budgets R of the budget table (none: no such
    table). The page's path back."""
    formats = check_formats(formats)
    roots = [Path(r) for r in ([runs_dir] if isinstance(runs_dir, (str, Path)) else runs_dir)]
    out = check_out(Path(out) if out else default_out(roots))
    runs, skipped = load_runs(roots, include_unfinished, include_duplicates)
    skipped = [(_relative(p, roots), why) for p, why in skipped]
    if skipped:
        say(f"fdlit report: {len(runs)} run(s) used, {len(skipped)} left out: "
            + "; ".join(f"{p} ({why})" for p, why in skipped))
    damaged = [(_relative(r.path, roots), r.unreadable_lines) for r in runs if r.unreadable_lines]
    if damaged:
        say(f"fdlit report: {sum(n for _, n in damaged)} unreadable line(s) of metrics.jsonl skipped (damaged, or "
            "nested too deep): " + "; ".join(f"{p} ({n})" for p, n in damaged))
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for r in runs:
        bytes_total(r)
    parts = regroup(runs)
    shown, tables = [], {"table1.md": [], "table1.csv": [], "table1.tex": []}
    with paper_style():
        for section in parts:
            prefix = f"{section.slug}_" if len(parts) > 1 else ""
            table = table1(section.runs)
            caption = table1_caption(table)
            md_caption = table1_caption(table, tied=f"marked {TIED_MARK}")
            heading = f"## {markdown_text(section.name)}\n\n" if len(parts) > 1 else ""
            tables["table1.md"].append(heading + markdown_text(md_caption) + "\n\n" + table1_markdown(table)
                                       + networks_markdown(section.runs) + legend_markdown(section.legend))
            csv = table1_csv(table)
            tables["table1.csv"].append(csv if not tables["table1.csv"] else csv.split("\n", 1)[1])
            tables["table1.tex"].append(table1_latex(table, caption))
            drawn, trust = section_figures(section.runs, table)
            figures = [(prefix + stem, caption_, fig.get_figwidth(), save_figure(fig, out / "figures", prefix + stem,
                                                                                 formats))
                       for stem, caption_, fig in drawn + trust if fig is not None]
            parts_html = []
            for stem, title, about, md, csv_text_, table_html in other_tables(section.runs, list(budgets)):
                legend = legend_markdown(section.legend) if stem != "adversaries" else ""  # its rows name no group
                tables.setdefault(f"{stem}.md", []).append(heading + about + "\n\n" + md + legend)
                earlier = tables.setdefault(f"{stem}.csv", [])
                earlier.append(csv_text_.split("\n", 1)[1] if earlier else csv_text_)  # one header line
                parts_html.append(f"<h3>{title} (<code>{stem}.md</code>, <code>{stem}.csv</code>)</h3>"
                                  f"<p>{html.escape(about)}</p>{table_html}")
            shown.append(SectionPage(section.name, section.legend, table, caption, figures,
                                     {prefix + stem for stem, *_ in trust}, table_selection(table), section.runs,
                                     "".join(parts_html)))
    page = page_html(runs, skipped, ", ".join(map(str, roots)), shown, formats, damaged)
    # the page first: the tables are never there without the page that says what they hold
    index = write_file(out / "index.html", page)
    for name, texts in tables.items():
        write_file(out / name, ("" if name.endswith(".csv") else "\n").join(texts))
    return index


def other_tables(runs, budgets: list[int]) -> list[tuple[str, str, str, str, str, str]]:
    """(file stem, title, caption, Markdown, CSV, HTML) of a section's tables beside Table 1: privacy (runs
    that measure it), bytes (runs that log their communication), round budgets (when asked for) and
    adversaries (attacked runs)."""
    out = []
    for stem, title, about, table in (("privacy", "Privacy", PRIVACY_CAPTION, privacy_table(runs)),
                                      ("bytes", "Accuracy against bytes", BYTES_CAPTION, bytes_table(runs)),
                                      ("budgets", "Round budgets", budget_caption(budgets),
                                       budget_table(runs, budgets))):
        if table is not None:
            out.append((stem, title, about, measure_markdown(table), measure_csv(table), measure_html(table, stem)))
    attacks = adversaries_table(runs)
    if attacks:
        out.append(("adversaries", "Adversaries", ADVERSARIES_CAPTION, adversaries_markdown(attacks),
                    adversaries_csv(attacks), adversaries_html(attacks)))
    return out


def section_figures(runs, table):
    """(file stem, caption, figure or None) of a section's figures, and of its trust matrices."""
    best = accuracy_words(runs)  # what every accuracy of a table or figure is
    methods = sorted({r.method for r in runs}, key=_method_sort)
    ks = table.ks or sorted({r.k for r in runs}, key=_k_sort)
    drawn = [
        ("figure2_accuracy_vs_k", f"Figure 2: {best} test accuracy vs classes per client k (mean ± std over "
         "seeds); dashed: local only, dotted: reference.", figure2(table)),
        ("appB_accuracy_curves", "App. B: mean global (top) and local (bottom) test accuracy after the public "
         "phase vs round, one panel per k; shaded ±1 std over seeds.",
         curves(runs, methods, ks, [(ACC, "global accuracy (%)"), (LOCAL, "local accuracy (%)")])),
        ("accuracy_vs_tau", f"{best.capitalize()} test accuracy vs sUWA's temperature τ (τ = 0 is AVG, τ = 1 is "
         "UWA), one line per k (mean ± std over seeds).", accuracy_vs_tau(runs)),
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
        ("privacy_upload_attacks_vs_epsilon", "What the uploads reveal (privacy.upload_audit): the "
         "label-distribution attack's total-variation error (left, mean over rounds; dotted: the uniform "
         "guess) and the membership attack's AUC from the clients' predictions (right, last round; 0.5 is "
         "chance) against the ε spent by the last round; dashed: the same rule without DP.",
         upload_attacks_vs_epsilon(runs)),
        ("accuracy_vs_bytes", "Mean global accuracy vs cumulative bytes sent (up + down, all clients), one "
         "panel per k.", curves(runs, methods, ks, [(ACC, "global accuracy (%)")], xkey="comm/bytes_total_mib",
                                xlabel="cumulative MiB (up + down)")),
    ]
    timed = sorted({r.method for r in runs if any(m.get(VIRTUAL_TIME) is not None for m in r.metrics)},
                   key=_method_sort)
    if timed:  # runs on a virtual clock (federation.clock): time to accuracy
        drawn.append(("accuracy_vs_virtual_time", "Mean global accuracy after the public phase vs virtual seconds "
                      "(federation.clock: the server's clock when each round's teacher was released, averaged "
                      "over seeds), one panel per k; shaded ±1 std over seeds.",
                      curves([r for r in runs if r.method in timed], timed, ks, [(ACC, "global accuracy (%)")],
                             xkey=VIRTUAL_TIME, xlabel="virtual seconds")))
    drawn += adversaries_figures(runs)
    trust = [(stem, f"Who to trust ({caption}): mean weight each client gets on public samples of each true "
              "class; a dot marks a client's own classes.", fig) for stem, caption, fig in trust_figures(runs)]
    return drawn, trust


def default_out(roots: list[Path]) -> Path:
    """``<runs>/report`` for one folder; for run directories or several folders, ``report`` in the
    folder that holds them all (never inside a run directory)."""
    if len(roots) == 1 and enclosing_run_directory(roots[0]) is None:
        return roots[0] / "report"
    common = Path(os.path.commonpath([os.path.abspath(r) for r in roots]))
    enclosing = enclosing_run_directory(common)
    while enclosing is not None and enclosing != enclosing.parent:  # never inside a run, at any depth
        common = enclosing.parent
        enclosing = enclosing_run_directory(common)
    return common / "report"


def _relative(path: Path, roots: list[Path]) -> Path:
    for root in roots:
        if path.is_relative_to(root) and path != root:
            return path.relative_to(root)
    return path


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
