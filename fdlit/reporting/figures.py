"""The report's figures (:mod:`fdlit.reporting.paper_figures` sizes them): Figure 2, accuracy vs τ,
accuracy and attack AUC vs ε, χ vs k, the App. B curves (and χ and bytes curves), and the
who-to-trust matrices."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from fdlit.reporting.labels import LOCAL_LABEL, REF_LABEL, _number, _section, suwa_tau
from fdlit.reporting.paper_figures import (
    ONE_COLUMN_IN,
    TWO_COLUMN_IN,
    legend_below,
    method_colors,
    new_figure,
    plain_text,
)
from fdlit.reporting.runs import Run, _k_sort, _method_sort, accuracy_words
from fdlit.reporting.table import Table
from fdlit.runs.dashboards import TRUST_KEY, TRUST_MAX_ROWS
from fdlit.runs.directory import safe_name


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


def accuracy_label(runs: list[Run]) -> str:
    """What ``Run.best`` is for these runs (each run by its own rule), as an axis label."""
    return f"{accuracy_words(runs)} test accuracy (%)" if runs else "best test accuracy (%)"


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
        ax.errorbar(taus, mean, yerr=std, marker="o", capsize=2, label=f"{group}k={k}".strip())
    return _single_panel(fig, ax, "sUWA temperature τ", accuracy_label(runs))


def privacy_label(run: Run) -> str:
    """The run's rule (without the block prefix) and, unless full logits, its upload encoding; noise on
    the securely aggregated sum (the central threat model) is a line of its own."""
    privacy = _section(run.config, "privacy")
    encoding = privacy.get("encoding") or "full"
    central = privacy.get("accounting") in ("central", "secure_aggregation")
    return (run.method.split("] ")[-1] + ("" if encoding == "full" else f" ({encoding})")
            + (", noise on the sum" if central else ""))


def accuracy_vs_epsilon(runs: list[Run]):
    """Best accuracy and membership-attack AUC (``privacy/mia_auc``, the audit) against the ε spent
    by the last round (``privacy/epsilon``); runs without DP drawn as dashed horizontal lines."""
    return _against_epsilon(runs, [(lambda r: 100 * r.best("public"), accuracy_label(runs), None),
                                   (lambda r: r.last("privacy/mia_auc"), "membership attack AUC", 0.5)])


def _mean_over_rounds(run: Run, key: str) -> float | None:
    values = [m[key] for m in run.metrics if m.get(key) is not None and math.isfinite(m[key])]
    return float(np.mean(values)) if values else None


def upload_attacks_vs_epsilon(runs: list[Run]):
    """The attacks on what clients share (``privacy.upload_audit``) against the ε spent by the last round:
    the label-distribution attack's TV error (mean over rounds; dotted: the uniform guess's) and the
    membership attack's AUC from predictions (last round); None without both audits and DP runs."""
    if not any(r.last("privacy/label_tv") is not None for r in runs):
        return None
    by_k: dict = defaultdict(list)  # the uniform guess's error depends on k (0.8 at k = 2 of 10 classes)
    for r in runs:
        if (c := _mean_over_rounds(r, "privacy/label_tv_chance")) is not None:
            by_k[r.k].append(c)
    chance = {k: float(np.mean(v)) for k, v in by_k.items()}
    return _against_epsilon(runs, [
        (lambda r: _mean_over_rounds(r, "privacy/label_tv"), "label-inference TV error", chance),
        (lambda r: r.last("privacy/upload_mia_auc"), "membership AUC from predictions", 0.5)])


def _against_epsilon(runs: list[Run], panels: list[tuple]):
    """One panel per (value of a run, y label, chance level, or one per k as {k: level}, or None)
    against the last round's ε."""
    from matplotlib.ticker import NullFormatter

    dp: dict[tuple, dict[float, list[tuple]]] = defaultdict(lambda: defaultdict(list))
    plain: dict[tuple, list[tuple]] = defaultdict(list)
    for r in runs:
        if r.kind != "rule":
            continue
        eps = r.last("privacy/epsilon")
        values = tuple(v if v is not None and math.isfinite(v) else None for v in (f(r) for f, _, _ in panels))
        key = (r.dataset, privacy_label(r), r.k)
        if eps is not None and math.isfinite(eps):
            dp[key][float(f"{eps:.6g}")].append(values)
        else:
            plain[key].append(values)
    if not dp:
        return None  # no run spent a privacy budget: nothing to plot against
    fig, axes = new_figure(len(panels), width=TWO_COLUMN_IN, panel_aspect=0.8)
    colors = method_colors(sorted({key for key in list(dp) + list(plain)}, key=str))
    for index, (_, ylabel, chance) in enumerate(panels):
        ax = axes[0, index]
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
        if isinstance(chance, dict):
            for k, level in sorted(chance.items(), key=lambda kv: str(kv[0])):
                ax.axhline(level, ls=":", lw=1, color="black", label=f"uniform guess, k={k}")
        elif chance is not None:
            ax.axhline(chance, ls=":", lw=1, color="black", label="chance")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # under a decade apart, minor labels overlap
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
    """One column per k, one row per (metric, label), each panel titled with its metric and k; a line
    per method, shaded ±1 std. The reference (trained on every class) is drawn in every column. Two
    columns of a paper wide (one with a single k)."""
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
                    x_rounds, x_mean, _ = _mean_curve(group, xkey)
                    at = dict(zip(x_rounds.tolist(), x_mean.tolist(), strict=True))
                    keep = [i for i, r in enumerate(xs.tolist()) if r in at]  # the rounds that were evaluated
                    xs, mean, std = np.array([at[xs[i]] for i in keep]), mean[keep], std[keep]
                scale = 100.0 if "acc" in key else 1.0  # accuracies in %, as in Table 1
                mean, std = mean * scale, std * scale
                ax.plot(xs, mean, marker=".", label=m, color=colors[m], **_style(m))
                ax.fill_between(xs, mean - std, mean + std, alpha=0.2, color=colors[m], linewidth=0)
            ax.set_title(plain_text(f"{panel_title(label)}, k = {k}"))
            ax.set_xlabel(plain_text(xlabel))
            if xkey is None:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if col == 0:
                ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    legend_below(fig, axes[0, 0])
    return fig


def panel_title(label: str) -> str:
    """A panel's title from its y label: the quantity without its unit (``global accuracy (%)``)."""
    return label.split(" (")[0]


def bytes_total(run: Run) -> None:
    """Adds ``comm/bytes_total_mib`` (up + down, cumulative) to every round of a run."""
    for m in run.metrics:
        up, down = _number(m.get("comm/up_bytes_total")), _number(m.get("comm/down_bytes_total"))
        m["comm/bytes_total_mib"] = None if up is None or down is None else (up + down) / 2**20


def trust_figures(runs: list[Run]) -> list[tuple[str, str, Any]]:
    """(file stem named by the run, caption, figure): the last-round who-to-trust matrix of every run
    that logged one (every rule, k and seed), a dot on each client's own classes where the run recorded
    them (``client_classes`` in its summary). One column wide."""
    from fdlit.runs.dashboards import draw_trust_heatmap

    out = []
    for r in sorted(runs, key=lambda r: (r.dataset, _method_sort(r.method), _k_sort(r.k), str(r.seed))):
        last = next((row for row in reversed(r.metrics) if row.get(TRUST_KEY)), None)
        if last is None:
            continue
        classes = r.summary.get("client_classes")
        title = f"{r.dataset + ' ' if r.dataset else ''}{r.method}, k={r.k}, seed {r.seed}, round {last['round']}"
        caption = title + ("" if classes else " (own classes not recorded by this run: no dots)")
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

