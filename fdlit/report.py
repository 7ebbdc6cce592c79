"""``python -m fdlit report <runs dir>``: the paper's tables and figures from local run directories.

Reads ``config.yaml``, ``metrics.jsonl`` and ``summary.json`` of every run under the folder (no W&B
needed) and writes ``<out>/index.html`` (self-contained: figures inlined as PNG data URIs),
``<out>/figures/*.png`` and ``<out>/table1.md``:

- Table 1: best mean global accuracy (%) per aggregator x k, mean ± std over seeds (Kovalchuk et al. 2026, Table 1);
- Figure 2: the same as accuracy vs k, one line per aggregator (Kovalchuk et al. 2026, Fig. 2);
- App. B curves: mean global and local accuracy vs round, shaded ±1 std over seeds
  (Kovalchuk et al. 2026, App. B.1);
- χ vs round, and accuracy vs cumulative bytes (up + down);
- the who-to-trust matrix of the last round, where the aggregator has weights.

"Best" is the best round's mean over clients after the public phase, as the loop's summary. When
every run has a validation set (``data.validation_size``), Table 1, Figure 2 and the runs table
select by validation instead: the test accuracy of the round with the best mean validation
accuracy (the loop's ``selected_global_acc_mean``), so no number is chosen on the test set. Std is
the sample std over seeds (n-1); a single seed shows ± 0. Each (setting, seed) counts once: when
several run directories hold the same config (a sweep run again, a run copied), the finished one
with the most rounds is used and the others are listed as left out, with the reason.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import yaml

from fdlit.data.federated import DEFAULT_CLASSES_PER_CLIENT
from fdlit.errors import ConfigError
from fdlit.runs.dashboards import TRUST_KEY, trust_heatmap_png
from fdlit.runs.directory import METRICS, read_config, read_jsonl, read_summary

ACC = "after_public/global_acc_mean"
LOCAL = "after_public/local_acc_mean"
VAL = "after_public/val_acc_mean"
SHORT_NAMES = {
    "ProbabilityAveragingAggregator": "AVG",
    "UncertaintyWeightedAggregator": "UWA",
    "SmoothedUncertaintyWeightedAggregator": "sUWA",
}
ORDER = {"AVG": 0, "UWA": 1, "sUWA": 2}


@dataclass
class Run:
    path: Path
    config: dict
    metrics: list[dict]
    summary: dict
    method: str = ""
    k: Any = None  # classes per client (int) or a label such as "dir0.1"
    seed: int = 0

    @property
    def finished(self) -> bool:
        return bool(self.summary.get("finished"))

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        rows = [(m["round"], m[key]) for m in self.metrics if m.get(key) is not None]
        return np.array([r for r, _ in rows], dtype=float), np.array([v for _, v in rows], dtype=float)

    def best(self) -> float:
        _, acc = self.series(ACC)
        return float(np.nanmax(acc)) if len(acc) else math.nan

    def selected(self) -> Optional[float]:
        """The test accuracy of the round with the best validation accuracy (the earliest on a tie,
        as the loop's summary), or None for a run without a validation set."""
        rows = [m for m in self.metrics if _finite(m.get(VAL)) and _finite(m.get(ACC))]
        return float(max(rows, key=lambda m: m[VAL])[ACC]) if rows else None

    def score(self, by_validation: bool) -> float:
        return self.selected() if by_validation else self.best()


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def by_validation(runs: list[Run]) -> bool:
    """Rank by validation only when every run can: mixing the two selections in one table would
    compare test-best numbers with validation-selected ones."""
    return bool(runs) and all(r.selected() is not None for r in runs)


def method_label(config: dict) -> str:
    agg = config.get("aggregator") or {}
    class_path = agg.get("class_path", "?") if isinstance(agg, dict) else str(agg)
    name = class_path.rsplit(".", 1)[-1]
    label = SHORT_NAMES.get(name, name)
    tau = (agg.get("init_args") or {}).get("tau") if isinstance(agg, dict) else None
    if label == "sUWA" and tau is not None:
        label += f" τ={tau:g}"  # the τ study's rows are sUWA at different temperatures
    return label


def setting_key(config: dict) -> str:
    """What makes two runs the same experiment: the whole config but the logger (name, folder, W&B)."""
    return json.dumps({k: v for k, v in config.items() if k not in ("logger", "config")}, sort_keys=True, default=str)


def load_runs(root: str | Path, include_unfinished: bool = False) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Runs under ``root`` (any depth), one per (setting, seed), and the run directories left out
    with the reason (unreadable, unfinished, or the same setting and seed as a run that is used)."""
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
        run = Run(path, config if isinstance(config, dict) else {}, read_jsonl(path / METRICS), summary)
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
        if key in used:
            skipped.append((run.path, f"same setting and seed as {used[key].name}"))
            continue
        used[key] = run.path
        data = run.config.get("data") or {}
        run.method = method_label(run.config)
        run.k = ((data.get("classes_per_client") or DEFAULT_CLASSES_PER_CLIENT)
                 if data.get("partition", "classes") == "classes" else f"dir{data.get('dirichlet_alpha')}")
        run.seed = run.config.get("seed", 0)
        runs.append(run)
    runs.sort(key=lambda r: r.path)
    if not runs:
        raise ConfigError("runs", f"no {'' if include_unfinished else 'finished '}run directories "
                          f"(config.yaml + metrics.jsonl) under {str(root)!r}"
                          + ("" if include_unfinished else "; --include_unfinished uses unfinished ones"))
    # runs that differ in anything but the studied knobs (e.g. two sweeps with different rounds in
    # one folder) are never pooled: the differing settings become part of the row label
    flat = [_flatten(r.config) for r in runs]
    differing = sorted(k for k in set().union(*flat)
                       if not k.startswith(STUDIED) and len({repr(f.get(k)) for f in flat}) > 1)
    for r, f in zip(runs, flat):
        if differing:
            r.method = "[" + ", ".join(f"{k.rsplit('.', 1)[-1]}={f.get(k)}" for k in differing) + "] " + r.method
    return runs, skipped


STUDIED = ("seed", "logger.", "checkpoint.", "aggregator", "data.classes_per_client", "data.dirichlet_alpha")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _k_sort(k: Any) -> tuple:
    return (0, k, "") if isinstance(k, (int, float)) else (1, 0, str(k))


def _method_sort(m: str) -> tuple:
    prefix, _, label = m.rpartition("] ")
    base = label.split(" τ=")[0]  # AVG, UWA, sUWA first, in the paper's order
    return (prefix, ORDER.get(base, 9), m)


def table1(runs: list[Run]) -> tuple[list[str], list, dict]:
    """methods, ks, cells[(method, k)] = (mean %, std %, n seeds)."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    validation = by_validation(runs)
    for r in runs:
        groups[(r.method, r.k)].append(100 * r.score(validation))
    cells = {}
    for key, values in groups.items():
        v = np.array(values)
        cells[key] = (float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v))
    methods = sorted({m for m, _ in groups}, key=_method_sort)
    ks = sorted({k for _, k in groups}, key=_k_sort)
    return methods, ks, cells


def table1_markdown(methods, ks, cells) -> str:
    best = {k: max((cells[(m, k)][0] for m in methods if (m, k) in cells), default=None) for k in ks}
    lines = ["| method | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for m in methods:
        row = []
        for k in ks:
            if (m, k) not in cells:
                row.append("–")
                continue
            mean, std, n = cells[(m, k)]
            text = f"{mean:.2f} ± {std:.2f}"
            row.append(f"**{text}**" if len(methods) > 1 and mean == best[k] else text)
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def table1_html(methods, ks, cells) -> str:
    best = {k: max((cells[(m, k)][0] for m in methods if (m, k) in cells), default=None) for k in ks}
    head = "".join(f"<th>k={html.escape(str(k))}</th>" for k in ks)
    body = []
    for m in methods:
        tds = []
        for k in ks:
            if (m, k) not in cells:
                tds.append("<td>–</td>")
                continue
            mean, std, n = cells[(m, k)]
            text = f"{mean:.2f} ± {std:.2f}"
            bold = len(methods) > 1 and mean == best[k]
            tds.append(f'<td title="{n} seed(s)">{"<b>" + text + "</b>" if bold else text}</td>')
        body.append(f"<tr><th>{html.escape(m)}</th>{''.join(tds)}</tr>")
    return (f'<table id="table1"><thead><tr><th>method</th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


# ---------------------------------------------------------------------------------------- figures
def _figure(ncols: int, nrows: int = 1, w: float = 3.6, h: float = 2.8):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), dpi=100)
    axes = np.array(fig.subplots(nrows, ncols, squeeze=False))
    return fig, axes


def _colors(methods: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def _mean_curve(runs: list[Run], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    by_round: dict[float, list[float]] = defaultdict(list)
    for r in runs:
        for x, v in zip(*r.series(key)):
            by_round[x].append(v)
    xs = np.array(sorted(by_round))
    mean = np.array([np.mean(by_round[x]) for x in xs])
    std = np.array([np.std(by_round[x], ddof=1) if len(by_round[x]) > 1 else 0.0 for x in xs])
    return xs, mean, std


def _png(fig) -> bytes:
    import io

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def figure2(methods, ks, cells) -> Optional[bytes]:
    numeric = [k for k in ks if isinstance(k, (int, float))]
    if not numeric:
        return None
    fig, axes = _figure(1, w=5.0, h=3.6)
    ax = axes[0, 0]
    for m, color in _colors(methods).items():
        pts = [(k, *cells[(m, k)][:2]) for k in numeric if (m, k) in cells]
        if pts:
            x, y, e = map(np.array, zip(*pts))
            ax.errorbar(x, y, yerr=e, marker="o", capsize=3, label=m, color=color)
    ax.set_xlabel("classes per client k")
    ax.set_ylabel("test accuracy (%), as Table 1")
    ax.set_xticks(numeric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Best accuracy vs classes per client", fontsize=10)
    return _png(fig)


def curves(runs: list[Run], methods, ks, panels: list[tuple[str, str]], xkey: Optional[str] = None,
           xlabel: str = "round") -> bytes:
    """One column per k, one row per (metric, label); a line per method, shaded ±1 std."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = _figure(len(ks), len(panels))
    colors = _colors(methods)
    for col, k in enumerate(ks):
        for row, (key, label) in enumerate(panels):
            ax = axes[row, col]
            for m in methods:
                group = [r for r in runs if r.method == m and r.k == k]
                if not group:
                    continue
                xs, mean, std = _mean_curve(group, key)
                if xkey is not None:  # e.g. cumulative bytes at each round, averaged over seeds
                    _, x_mean, _ = _mean_curve(group, xkey)
                    n = min(len(xs), len(x_mean))
                    xs, mean, std = x_mean[:n], mean[:n], std[:n]
                scale = 100.0 if "acc" in key else 1.0  # accuracies in %, as in Table 1
                mean, std = mean * scale, std * scale
                ax.plot(xs, mean, marker=".", label=m, color=colors[m])
                ax.fill_between(xs, mean - std, mean + std, alpha=0.2, color=colors[m])
            ax.set_title(f"k={k}", fontsize=9)
            ax.set_xlabel(xlabel)
            if xkey is None:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if col == 0:
                ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    return _png(fig)


def bytes_total(run: Run) -> None:
    """Adds ``comm/bytes_total_mib`` (up + down, cumulative) to every round of a run."""
    for m in run.metrics:
        up, down = m.get("comm/up_bytes_total"), m.get("comm/down_bytes_total")
        m["comm/bytes_total_mib"] = None if up is None or down is None else (up + down) / 2**20


def trust_figures(runs: list[Run], methods, ks) -> list[tuple[str, bytes]]:
    """Last-round who-to-trust matrix of the lowest-seed run of each method at the smallest k."""
    out = []
    if not ks:
        return out
    k = ks[0]
    for m in methods:
        group = sorted((r for r in runs if r.method == m and r.k == k), key=lambda r: r.seed)
        last = next((row for r in group for row in reversed(r.metrics) if row.get(TRUST_KEY)), None)
        if last is not None:
            out.append((f"{m}, k={k}, round {last['round']}",
                        trust_heatmap_png(last[TRUST_KEY], f"{m}, k={k}, round {last['round']}")))
    return out


# ------------------------------------------------------------------------------------------- page
CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child{text-align:left}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:0.9em}code{background:#f4f4f4;padding:0 3px}"""


def write_report(runs_dir: str | Path, out: Optional[str | Path] = None, include_unfinished: bool = False,
                 say: Callable[[str], None] = print) -> Path:
    out = Path(out) if out else Path(runs_dir) / "report"
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"must be a folder (or not exist yet), but {str(out)!r} is a file")
    runs, skipped = load_runs(runs_dir, include_unfinished)
    skipped = [(p.relative_to(runs_dir) if p.is_relative_to(runs_dir) else p, why) for p, why in skipped]
    if skipped:
        say(f"fdlit report: {len(runs)} run(s) used, {len(skipped)} left out: "
            + "; ".join(f"{p} ({why})" for p, why in skipped))
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for r in runs:
        bytes_total(r)
    methods, ks, cells = table1(runs)
    validation = by_validation(runs)
    what = ("Validation-selected mean global test accuracy (%: at the round with the best mean validation "
            "accuracy)" if validation else "Best mean global test accuracy (%)")
    md = table1_markdown(methods, ks, cells)
    (out / "table1.md").write_text(f"{what}, mean ± std over seeds (best per column in bold).\n\n" + md)

    figures: list[tuple[str, str, bytes]] = []  # (file, caption, png)
    fig2 = figure2(methods, ks, cells)
    if fig2 is not None:
        figures.append(("figure2_accuracy_vs_k.png",
                        "Figure 2: Table 1's test accuracy vs classes per client k (mean ± std over seeds).", fig2))
    figures.append(("appB_accuracy_curves.png",
                    "App. B: mean global (top) and local (bottom) test accuracy after the public phase vs "
                    "round; shaded ±1 std over seeds.",
                    curves(runs, methods, ks, [(ACC, "global accuracy (%)"), (LOCAL, "local accuracy (%)")])))
    if any(m.get("weights/chi") is not None for r in runs for m in r.metrics):
        figures.append(("chi_vs_round.png", "Weight concentration χ = E_x Σ_i W[i,x]² vs round (1/M for AVG).",
                        curves(runs, methods, ks, [("weights/chi", "χ")])))
    figures.append(("accuracy_vs_bytes.png",
                    "Mean global accuracy vs cumulative bytes sent (up + down, all clients).",
                    curves(runs, methods, ks, [(ACC, "global accuracy (%)")], xkey="comm/bytes_total_mib",
                           xlabel="cumulative MiB (up + down)")))
    for i, (caption, png) in enumerate(trust_figures(runs, methods, ks)):
        figures.append((f"trust_matrix_{i}.png",
                        f"Who to trust ({caption}): mean weight each client gets on public samples of each "
                        "true class.", png))
    for name, _, png in figures:
        (out / "figures" / name).write_bytes(png)

    run_rows = "".join(
        f"<tr><td>{html.escape(r.path.name)}</td><td>{html.escape(r.method)}</td><td>{html.escape(str(r.k))}</td>"
        f"<td>{r.seed}</td><td>{len(r.metrics)}</td><td>{'yes' if r.finished else 'no'}</td>"
        f"<td>{100 * r.best():.2f}</td><td>{'–' if r.selected() is None else f'{100 * r.selected():.2f}'}</td></tr>"
        for r in sorted(runs, key=lambda r: (_method_sort(r.method), _k_sort(r.k), r.seed)))
    figure_html = "".join(
        f'<figure><img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{html.escape(name)}">'
        f"<figcaption>{html.escape(caption)} <code>figures/{html.escape(name)}</code></figcaption></figure>"
        for name, caption, png in figures)
    note = (f"<p>{len(skipped)} run(s) left out (<code>--include_unfinished</code> uses unfinished ones):</p><ul>"
            + "".join(f"<li><code>{html.escape(str(p))}</code>: {html.escape(why)}</li>" for p, why in skipped)
            + "</ul>" if skipped else "")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>fdlit report: {html.escape(str(runs_dir))}</title>
<style>{CSS}</style></head><body>
<h1>fdlit report</h1>
<p>{len(runs)} run(s) from <code>{html.escape(str(runs_dir))}</code>.</p>
{note}
<h2>Table 1: {"validation-selected" if validation else "best"} test accuracy (%)</h2>
<p>{"Mean global test accuracy over clients (after the public phase) at the round with the best mean validation accuracy"
    if validation else "Best round's mean global accuracy over clients (after the public phase)"}; mean ± std over seeds; best per column in bold.</p>
{table1_html(methods, ks, cells)}
<h2>Figures</h2>
{figure_html}
<h2>Runs</h2>
<table id="runs"><thead><tr><th>run</th><th>method</th><th>k</th><th>seed</th><th>rounds</th><th>finished</th>
<th>best acc (%)</th><th>validation-selected acc (%)</th></tr></thead><tbody>{run_rows}</tbody></table>
</body></html>
"""
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
