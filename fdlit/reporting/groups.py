"""Which runs a report shows together, and how their groups are named.

A researcher's runs folder is mixed: two datasets, several models, a sweep at other rounds, a run
with a bigger network. The report draws one *section* per dataset (and per model, when a dataset
was run with several), each with its own Table 1 and figures. Inside a section, runs that differ in
anything but the studied knobs (seed, the method, k, the mode) are never pooled: they form setting
groups, and a group's label names only the fewest settings that tell the groups shown apart
(``[lr=0.01] AVG``), at most ``MAX_LABEL`` characters; when that does not fit, the groups are
lettered (``[A] AVG``). The legend table (``Section.legend``) lists every setting in which a
section's groups differ, in full."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from fdlit.reporting.labels import _flatten, _section
from fdlit.runs.checkpoint import without_noop_sections

MAX_LABEL = 60  # characters of a row label or a legend entry
# what a table's rows and columns already show, or what changes no result
STUDIED = ("seed", "logger.", "checkpoint.", "aggregator", "data.classes_per_client", "data.dirichlet_alpha",
           "federation.mode", "config")


@dataclass
class Section:
    """The runs of one dataset (and model): one Table 1 and one set of figures."""
    name: str  # "digits", or "digits, MLP" when the dataset was run with several models
    runs: list = field(default_factory=list)
    # group label ("[lr=0.01] " or "[A] ") -> {setting: value} of every setting the groups differ in
    legend: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() or c in "-_" else "_" for c in self.name.replace(", ", "-"))


def model_name(config: dict) -> str:
    """The model's class name (the last dotted part of its class path), as text."""
    path = _section(config, "model").get("class_path", "")
    return str(path).rsplit(".", 1)[-1] if path else ""


def sections(runs: list) -> list[Section]:
    """The runs split by dataset (and model where a dataset holds several), each given its group label
    (``run.group``, prefixed to ``run.method``) and its section's legend."""
    by_dataset: dict[str, list] = {}
    for r in runs:
        by_dataset.setdefault(r.dataset, []).append(r)
    out = []
    for dataset, group in sorted(by_dataset.items()):
        # reference and local-only runs have the dataset's model: they join every model's section
        models = sorted({model_name(r.config) for r in group})
        for model in models:
            name = dataset if len(models) == 1 else f"{dataset}, {model or 'default model'}"
            out.append(Section(name or "(no dataset)", [r for r in group if model_name(r.config) == model]))
    for section in out:
        name_method_arguments(section.runs)
        name_groups(section)
        for r in section.runs:
            r.section, r.group_settings = section.name, section.legend.get(r.group, {})
    return out


def regroup(runs: list) -> list[Section]:
    """The sections of runs named by :func:`sections` (in their order), legends included."""
    out: dict[str, Section] = {}
    for r in runs:
        section = out.setdefault(r.section, Section(r.section))
        section.runs.append(r)
        if r.group:
            section.legend[r.group] = r.group_settings
    return list(out.values())


def compact(value: Any) -> str:
    """A setting's value in few characters: ``[256,128]``, ``0.001``, ``default`` when unset."""
    if value is None:
        return "default"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key by its last part, or by more parts where two would read the same."""
    names = {}
    for k in keys:
        parts = [p for p in k.split(".") if p != "init_args"]
        n = 1
        while n < len(parts) and any(o != k and [p for p in o.split(".") if p != "init_args"][-n:] == parts[-n:]
                                     for o in keys):
            n += 1
        names[k] = ".".join(parts[-n:])
    return names


def distinguishing(groups: list[dict[str, str]], keys: list[str]) -> list[str]:
    """The fewest keys (greedy) whose values tell every two groups apart; in ``keys`` order."""
    confused = set(combinations(range(len(groups)), 2))
    chosen: list[str] = []
    while confused:
        best = max(keys, key=lambda k: sum(groups[i][k] != groups[j][k] for i, j in confused))
        chosen.append(best)
        confused = {(i, j) for i, j in confused if groups[i][best] == groups[j][best]}
    return [k for k in keys if k in chosen]


def name_groups(section: Section) -> None:
    flat = [_flatten(without_noop_sections(r.config)) for r in section.runs]  # a no-op section is no difference
    keys = sorted(k for k in set().union(*flat) if not k.startswith(STUDIED)
                  and len({repr(f.get(k)) for f in flat}) > 1 and not _of_the_method(k, section.runs, flat))
    if not keys:
        return
    values = [{k: compact(f.get(k)) for k in keys} for f in flat]
    distinct: list[dict[str, str]] = []
    for v in values:
        if v not in distinct:
            distinct.append(v)
    chosen = distinguishing(distinct, keys)
    names = short_keys(chosen)
    labels = [", ".join(f"{names[k]}={v[k]}" for k in chosen) for v in distinct]
    longest_method = max(len(r.method) for r in section.runs)
    if max(len(label) for label in labels) + 3 + longest_method > MAX_LABEL:
        labels = [letter(i) for i in range(len(distinct))]
    for label, v in zip(labels, distinct, strict=True):
        section.legend[f"[{label}] "] = {k: v[k] for k in keys}
    for r, v in zip(section.runs, values, strict=True):
        r.group = f"[{labels[distinct.index(v)]}] "
        r.method = r.group + r.method


def _of_the_method(key: str, runs: list, flat: list[dict[str, Any]]) -> bool:
    """A setting every run of each method shares (DS-FL's server model, a method file's own
    optimizer) is part of the method the row already names, not a group of runs."""
    values: dict[str, set[str]] = {}
    for r, f in zip(runs, flat, strict=True):
        values.setdefault(r.method, set()).add(repr(f.get(key)))
    return len(values) > 1 and all(len(v) == 1 for v in values.values())


def letter(i: int) -> str:
    return chr(ord("A") + i % 26) + (str(i // 26) if i >= 26 else "")


def name_method_arguments(runs: list) -> None:
    """Runs of one method (and group) with different arguments (FedDF's temperature, say) are not
    pooled as seeds: the arguments they differ in follow the method's label (sUWA's τ already does)."""
    by_method: dict[str, list] = {}
    for r in runs:
        by_method.setdefault(r.method, []).append(r)
    for same in by_method.values():
        flat = [_flatten(_section(_section(r.config, "aggregator"), "init_args")) for r in same]
        keys = sorted(k for k in set().union(*flat) if len({repr(f.get(k)) for f in flat}) > 1
                      and not (k == "tau" and "τ=" in same[0].method))
        for r, f in zip(same, flat, strict=True):
            if keys:
                r.method += " (" + ", ".join(f"{k}={compact(f.get(k))}" for k in keys) + ")"
