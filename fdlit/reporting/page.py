"""The report's page, ``index.html``: self-contained (figures inlined as PNG data URIs), every value
from a run escaped, and a Content-Security-Policy that allows no script and no request."""

from __future__ import annotations

import base64
import hashlib
import html
import math
from dataclasses import dataclass

from fdlit.reporting.labels import REF_LABEL
from fdlit.reporting.paper_figures import FORMATS, MIN_FONT_PT, ONE_COLUMN_IN, PNG_DPI, TWO_COLUMN_IN
from fdlit.reporting.runs import SELECTED, Run, _k_sort, _method_sort, selection, shared_settings
from fdlit.reporting.table import Table, _first_of_block, _row_cells, _show_dataset
from fdlit.reporting.table_files import measured_networks

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
    metric = {"test": "the best round's mean global test accuracy over clients (no run has a validation set)",
              "validation": f"<b>validation-selected</b> accuracy (<code>{SELECTED}</code>; every run has a "
                            "validation set)",
              "mixed": f"each run by its own rule: <b>validation-selected</b> accuracy (<code>{SELECTED}</code>) "
                       "for the runs with a validation set, the best round's test accuracy for the others; "
                       "each row says which (<i>selected by</i>)"}[selection(runs)]
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


def table1_html(table: Table) -> str:
    show_dataset = _show_dataset(table)
    phases = table.phases
    head1 = ('<th rowspan="2">dataset</th>' if show_dataset else "") + '<th rowspan="2">method</th>'
    head1 += "".join(f'<th colspan="{len(phases)}">k={html.escape(str(k))}</th>' for k in table.ks)
    if table.ref:
        head1 += (f'<th rowspan="2" class="ref" title="fully informed reference (federation.mode: reference)">'
                  f"{REF_LABEL}</th>")
    head1 += ('<th rowspan="2" title="validation: the round of highest validation accuracy; test: the round of highest test '
              'accuracy">selected by</th>')
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
        tds.append(f'<td class="selection">{html.escape(table.selection.get((dataset, label)) or "–")}</td>')
        body.append(f"<tr{row_class}>{dataset_cell}<th>{html.escape(label)}</th>{''.join(tds)}</tr>")
    return (f'<table id="table1"><thead><tr>{head1}</tr><tr>{head2}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def table1_heading(rule: str) -> str:
    """What Table 1 holds, as its heading says, for its rows' selection (``validation``, ``test`` or
    ``mixed``: each run by its own rule)."""
    return {"validation": "validation-selected test accuracy (%): the round with the best validation accuracy",
            "test": "best test accuracy (%): the round with the best test accuracy",
            "mixed": "test accuracy (%) at the round each run's own rule selects (validation accuracy where the "
                     "run has a validation set, else test accuracy; column \"selected by\")"}[rule]


def runs_html(runs: list[Run]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(r.path.name)}</td><td>{html.escape(r.method)}</td><td>{html.escape(str(r.k))}</td>"
        f"<td>{html.escape(str(r.seed))}</td><td>{len(r.metrics)}</td><td>{'yes' if r.finished else 'no'}</td>"
        f"<td>{_percent(r.best('private'))}</td><td>{_percent(r.best('public'))}</td>"
        f"<td>{_percent(r.best('personalized'))}</td><td>{'yes' if r.selected else 'no'}</td></tr>"
        for r in sorted(runs, key=lambda r: (r.dataset, _method_sort(r.method), _k_sort(r.k), str(r.seed))))
    return ('<table id="runs"><thead><tr><th>run</th><th>method</th><th>k</th><th>seed</th><th>rounds</th>'
            "<th>finished</th>\n<th>best acc after private (%)</th><th>best acc after public (%)</th>"
            "<th>personalized acc (%)</th>"
            f"<th>validation-selected</th></tr></thead>\n<tbody>{rows}</tbody></table>")


def figures_html(items, formats) -> str:
    """(file stem, caption, width in inches, PNG bytes) as figures with their captions and files."""
    out = []
    for stem, caption, width, png in items:
        size = "one" if width <= ONE_COLUMN_IN + 0.01 else "two"
        files = ", ".join(f"<code>figures/{html.escape(stem)}.{fmt}</code>" for fmt in FORMATS
                          if fmt in formats or fmt == "png")
        out.append(
            f'<figure class="{size}"><img src="data:image/png;base64,{base64.b64encode(png).decode()}" '
            f'alt="{html.escape(stem)}"><figcaption>{html.escape(caption)} {files} '
            f"({width:g} in wide: {size} column{'s' if size == 'two' else ''})</figcaption></figure>")
    return "".join(out)


@dataclass
class SectionPage:
    """What the page shows of one section (a dataset, or a dataset and model)."""
    name: str
    legend: dict  # group label -> the settings it stands for
    table: Table
    caption: str
    figures: list  # (file stem, caption, width in inches, PNG bytes)
    trust_stems: set
    selection: str  # "validation", "test" or "mixed" (:func:`fdlit.reporting.table.table_selection`)
    runs: list
    tables_html: str = ""  # the tables beside Table 1 (privacy, bytes, round budgets, adversaries), headed


def legend_html(legend: dict) -> str:
    """The legend table: what each group label stands for, every setting the groups differ in."""
    if not legend:
        return ""
    keys = list(next(iter(legend.values())))
    head = "".join(f"<th><code>{html.escape(k)}</code></th>" for k in keys)
    rows = "".join(f"<tr><th>{html.escape(label.strip())}</th>"
                   + "".join(f"<td>{html.escape(str(settings.get(k, '')))}</td>" for k in keys) + "</tr>"
                   for label, settings in legend.items())
    return ("<p>Row labels name the fewest settings that tell this section's groups of runs apart; "
            "every setting they differ in:</p>"
            f'<table class="legend"><thead><tr><th>group</th>{head}</tr></thead><tbody>{rows}</tbody></table>')


def section_html(section: SectionPage, formats, several: bool) -> str:
    """A section's Table 1 (with the rule that picked its numbers), legend, figures and trust matrices."""
    title = f"{html.escape(section.name)}: " if several else ""
    trust_figs = [f for f in section.figures if f[0] in section.trust_stems]
    trust_html = (f'<h3>Who to trust</h3><div class="trust">{figures_html(trust_figs, formats)}</div>'
                  if trust_figs else "")
    return f"""<h2>{title}Table 1: {table1_heading(section.selection)}</h2>
<p>{html.escape(section.caption)}</p>
{table1_html(section.table)}
{_networks_html(section.runs)}
{legend_html(section.legend)}
{section.tables_html}
<h3>Figures{' of ' + html.escape(section.name) if several else ''}</h3>
{figures_html([f for f in section.figures if f[0] not in section.trust_stems], formats)}
{trust_html}"""


def _networks_html(runs) -> str:
    networks = measured_networks(runs)
    if not networks:
        return ""
    items = "".join(f"<li>{html.escape(label)}: {html.escape(text)}</li>" for label, text in networks.items())
    return f'<p>Network measured:</p><ul class="networks">{items}</ul>'


def page_html(runs: list[Run], skipped, runs_dir, sections: list[SectionPage], formats, damaged=()) -> str:
    """The whole page: settings, the runs left out, per section Table 1, its legend, figures and
    trust matrices; the runs. ``damaged``: (run, metrics lines skipped as unreadable)."""
    flags = "<code>--include_unfinished</code> uses unfinished ones, <code>--include_duplicates</code> keeps copies"
    note = (f"<p>{len(skipped)} run(s) left out ({flags}):</p><ul>"
            + "".join(f"<li><code>{html.escape(str(p))}</code>: {html.escape(why)}</li>" for p, why in skipped)
            + "</ul>" if skipped else "")
    if damaged:
        note += (f"<p>{sum(n for _, n in damaged)} unreadable line(s) of <code>metrics.jsonl</code> skipped (damaged, "
                 "or nested too deep):</p><ul>" + "".join(f"<li><code>{html.escape(str(p))}</code>: {n}</li>"
                                                         for p, n in damaged) + "</ul>")
    several = len(sections) > 1
    names = ", ".join(html.escape(s.name) for s in sections)
    parts = "".join(section_html(s, formats, several) for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{content_security_policy()}">
<meta name="referrer" content="no-referrer">
<title>fdlit report: {html.escape(str(runs_dir))}</title>
<style>{CSS}</style></head><body>
<h1>fdlit report</h1>
<p>{len(runs)} run(s) from <code>{html.escape(str(runs_dir))}</code>{f"; one section per dataset and model: {names}"
                                                                     if several else ""}.</p>
<h2>Settings</h2>
{settings_html(runs, skipped, runs_dir)}
{note}
<p>Tables: <code>table1.md</code>, <code>table1.csv</code>, <code>table1.tex</code> (booktabs){", one per section"
                                                                                             if several else ""}.
Each figure as {_formats_text(formats)}, sized for a one-column ({ONE_COLUMN_IN:g} in) or
two-column ({TWO_COLUMN_IN:g} in) paper figure, text at least {MIN_FONT_PT} pt at that size.</p>
{parts}
<h2>Runs</h2>
{runs_html(runs)}
</body></html>
"""
