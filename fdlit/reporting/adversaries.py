"""The report's adversaries figures (docs/adversaries.md): one figure per attack, the honest
clients' accuracy against the fraction of attackers, one line per rule.

A run belongs to an attack by its ``adversaries`` section without the attackers' number (the
attack's class path and arguments, ``redraw``, ``collude``); its x is the share of clients that
attack (``count``, ``round(fraction * M)`` or ``len(ids)``, over M = ``data.num_clients``). The 0 %
point of a line is a run without attackers of the same setting: the same config apart from the
``adversaries`` section and the seed (and apart from the logger, as in
:func:`fdlit.reporting.labels.setting_key`). y is the honest clients' mean global accuracy at the last
evaluated round (``adversaries/honest_global_acc``; without attackers every client is honest:
``after_public/global_acc_mean``), mean ± std over seeds; a second panel holds the attackers'
weight in the teacher or the global model (``adversaries/weight``) where a rule reports it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fdlit.adversaries.section import attacker_count
from fdlit.reporting.labels import _flatten, method_label, setting_key
from fdlit.reporting.paper_figures import TWO_COLUMN_IN, legend_below, method_colors, new_figure, plain_text
from fdlit.runs.directory import safe_name

HONEST = "adversaries/honest_global_acc"
WEIGHT = "adversaries/weight"
ALL_CLIENTS = "after_public/global_acc_mean"
COUNTS = ("count", "fraction", "ids")


@dataclass
class Line:
    """One rule's points in one attack's figure: x -> {seed: value}."""
    label: str
    config: dict  # the setting (without adversaries and seed), to tell lines of the same rule apart
    acc: dict = field(default_factory=lambda: defaultdict(dict))
    weight: dict = field(default_factory=lambda: defaultdict(dict))

    def points(self, which: str = "acc") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, mean, sample std over seeds; 0 with one seed), x sorted; only finite values."""
        by_x = self.acc if which == "acc" else self.weight
        pts = []
        for x in sorted(by_x):
            values = [v for v in by_x[x].values() if math.isfinite(v)]
            if values:
                pts.append((x, np.mean(values), np.std(values, ddof=1) if len(values) > 1 else 0.0))
        return tuple(np.array(c, dtype=float) for c in zip(*pts, strict=True)) if pts else (np.array([]),) * 3


def _section(config: dict) -> dict | None:
    section = config.get("adversaries")
    return section if isinstance(section, dict) else None


def _attack(config: dict) -> dict | None:
    attack = (_section(config) or {}).get("attack")
    return attack if isinstance(attack, dict) and attack.get("class_path") else None


def attack_key(config: dict) -> str | None:
    """What makes two runs the same attack: the section without the attackers' number; None: no attack."""
    if _attack(config) is None:
        return None
    return json.dumps({k: v for k, v in _section(config).items() if k not in COUNTS}, sort_keys=True, default=str)


def attack_label(config: dict) -> str:
    """E.g. ``ConfidentWrong(confidence=10.0, target=0), collude``."""
    section, attack = _section(config), _attack(config)
    args = attack.get("init_args") if isinstance(attack.get("init_args"), dict) else {}
    args = sorted((k, v) for k, v in args.items() if v is not None)  # None: the argument is not used
    name = str(attack["class_path"]).rsplit(".", 1)[-1]
    text = name + (f"({', '.join(f'{k}={v}' for k, v in args)})" if args else "")
    return ", ".join([text] + [flag for flag in ("redraw", "collude") if section.get(flag)])


def base_key(config: dict) -> str:
    """The setting a run attacks: its whole config but the logger, the seed and the adversaries section."""
    return setting_key(_setting(config))


def _setting(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ("adversaries", "seed", "logger", "config")}


def attacked_share(config: dict) -> float | None:
    """The share of clients that attack (0 without an attack); None when the config cannot say."""
    section = _section(config) or {}
    if _attack(config) is None:
        return 0.0
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    m = data.get("num_clients")
    if not isinstance(m, int) or m <= 0:
        fraction = section.get("fraction")
        return float(fraction) if isinstance(fraction, (int, float)) and section.get("ids") is None else None
    try:
        return attacker_count(section.get("count"), section.get("fraction"), section.get("ids"), m) / m
    except (TypeError, ValueError):
        return None


def _last_finite(run, key: str) -> float | None:
    _, values = run.series(key)
    finite = [float(v) for v in values if math.isfinite(v)]
    return finite[-1] if finite else None


def attack_lines(runs: list) -> dict[str, tuple[str, list[Line]]]:
    """attack key -> (attack label, its lines): every setting attacked by that attack, with its runs
    without attackers as the 0 % point. Reference runs (one pooled model) are never attacked."""
    runs = [r for r in runs if r.kind != "ref"]
    attacked = [(r, attack_key(r.config)) for r in runs]
    out: dict[str, tuple[str, dict[str, Line]]] = {}
    for r, key in attacked:
        if key is not None:
            out.setdefault(key, (attack_label(r.config), {}))[1].setdefault(
                base_key(r.config), Line(method_label(r.config), _setting(r.config)))
    clean = [r for r, key in attacked if key is None]
    for key, (_, lines) in out.items():
        members = [r for r, k in attacked if k == key] + clean
        for r in members:
            line = lines.get(base_key(r.config))
            x = attacked_share(r.config)
            if line is None or x is None:
                continue
            acc = _last_finite(r, HONEST if x > 0 else ALL_CLIENTS)
            weight = _last_finite(r, WEIGHT) if x > 0 else 0.0
            seed = str(r.seed)
            if acc is not None and seed not in line.acc[x]:  # the attack's own 0 % run before a clean one
                line.acc[x][seed] = acc
            if weight is not None and seed not in line.weight[x]:
                line.weight[x][seed] = weight
    return {key: (label, _tell_apart(list(lines.values()))) for key, (label, lines) in out.items()}


def _tell_apart(lines: list[Line]) -> list[Line]:
    """Lines of the same rule label get the settings they differ in, e.g. ``AVG [classes_per_client=5]``."""
    by_label = defaultdict(list)
    for line in lines:
        by_label[line.label].append(line)
    for same in by_label.values():
        if len(same) > 1:
            flat = [_flatten(line.config) for line in same]
            differing = sorted(k for k in set().union(*flat) if len({repr(f.get(k)) for f in flat}) > 1)
            for line, f in zip(same, flat, strict=True):
                line.label += " [" + ", ".join(f"{k.rsplit('.', 1)[-1]}={f.get(k)}" for k in differing) + "]"
    return sorted(lines, key=lambda line: line.label)


def adversaries_figures(runs: list) -> list[tuple[str, str, Any]]:
    """(file stem, caption, figure) per attack with at least two fractions of attackers."""
    out, stems = [], set()
    for _, (label, lines) in sorted(attack_lines(runs).items(), key=lambda kv: kv[1][0]):
        if len({x for line in lines for x in line.points()[0]}) < 2:
            continue  # one fraction only: nothing to plot against
        weighted = [line for line in lines if len(line.points("weight")[0])]
        fig, axes = new_figure(2 if weighted else 1, width=TWO_COLUMN_IN if weighted else TWO_COLUMN_IN / 2,
                               panel_aspect=0.72)
        colors = method_colors([line.label for line in lines])
        panels = [(axes[0, 0], "acc", lines, "honest clients' accuracy (%)", 100)]
        if weighted:
            panels.append((axes[0, 1], "weight", weighted, "attackers' weight", 1))
        for ax, which, shown, ylabel, scale in panels:
            for line in shown:
                x, mean, std = line.points(which)
                if len(x):
                    ax.errorbar(100 * x, scale * mean, yerr=scale * std, marker="o", capsize=2,
                                color=colors[line.label], label=plain_text(line.label) if which == "acc" else None)
            ax.set_xlabel("attackers (% of clients)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        if weighted:  # a rule that weighs every client alike gives the attackers their share
            top = max(x for line in weighted for x in line.points("weight")[0])
            axes[0, 1].plot([0, 100 * top], [0, top], color="gray", linestyle=":")
        legend_below(fig, axes[0, 0])
        stem = f"adversaries_{safe_name(label)}"
        stem = stem if stem not in stems else f"{stem}_{len(stems)}"
        stems.add(stem)
        caption = (f"Attack {label}: the honest clients' mean global test accuracy at the last evaluated round "
                   "against the share of attackers, one line per rule (mean ± std over seeds; 0 %: the same "
                   "setting without attackers)"
                   + ("; right: the attackers' total weight in the teacher or the global model "
                      "(adversaries/weight), dotted: their share of the clients." if weighted else "."))
        out.append((stem, caption, fig))
    return out
