"""The runs a report is made of: every run directory under a folder, one per (setting, seed), with
its method's label, k, seed, dataset and the settings it differs in from the others."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fdlit.data.federated import DEFAULT_CLASSES_PER_CLIENT
from fdlit.errors import ConfigError
from fdlit.reporting.labels import LOCAL_LABEL, _flatten, _number, _section, method_label, run_kind, setting_key
from fdlit.runs.directory import METRICS, RunFileError, read_config, read_jsonl_counted, read_summary
from fdlit.runs.run_files import SWEEP_BOOKKEEPING

ACC = "after_public/global_acc_mean"
PRIVATE_ACC = "after_private/global_acc_mean"
LOCAL = "after_public/local_acc_mean"
SELECTED = "selected_global_acc_mean"  # validation-selected accuracy, when the run's summary has one
ORDER = {"AVG": 0, "UWA": 1, "sUWA": 2}
# "personalized": the mean over clients of each client's accuracy on its own classes' test samples
# (after_public/local_acc_mean), as the personalization papers (FedProto, FML, FedKD, ...) report
PHASES = (("private", "after private"), ("public", "after public"), ("personalized", "personalized"))


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
    group: str = ""  # the settings this run differs in from others of its section, e.g. "[rounds=5] "
    section: str = ""  # its dataset (and model, where the dataset was run with several): fdlit.reporting.groups
    group_settings: dict = field(default_factory=dict)  # every setting its section's groups differ in
    unreadable_lines: int = 0  # metrics.jsonl lines skipped as unreadable (damaged, or nested too deep)

    @property
    def finished(self) -> bool:
        return bool(self.summary.get("finished"))

    @property
    def selected(self) -> bool:
        """Whether this run's numbers are validation-selected: by its own summary alone, so a run's
        numbers never depend on the other runs of a report."""
        return _number(self.summary.get(SELECTED)) is not None

    @property
    def selection(self) -> str:
        """How this run's round was chosen: ``validation`` or ``test`` (best test accuracy)."""
        return "validation" if self.selected else "test"

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(rounds, values) of the rows where both are numbers: a value someone edited into a list,
        a dict or text is a missing value, not a failed report."""
        rows = [(_number(m.get("round")), _number(m.get(key))) for m in self.metrics]
        rows = [(r, v) for r, v in rows if r is not None and v is not None]
        return np.array([r for r, _ in rows], dtype=float), np.array([v for _, v in rows], dtype=float)

    def best(self, phase: str = "public") -> float:
        """Best mean global accuracy (fraction) after the ``private`` or ``public`` phase; for
        ``personalized``, the mean local accuracy after the public phase at the round the global number
        was selected at (validation-selected runs), else its best round."""
        if phase == "personalized":
            rounds, local = self.series(LOCAL)
            chosen = _number(self.summary.get("selected_round")) if self.selected else None
            if chosen is not None and chosen in rounds:
                return float(local[list(rounds).index(chosen)])
            return float(np.nanmax(local)) if len(local) else math.nan
        keys = ((SELECTED, "best_global_acc_mean") if phase == "public"
                else (SELECTED + "_after_private", "best_global_acc_mean_after_private"))
        keys = keys if self.selected else keys[1:]
        for key in keys:
            value = _number(self.summary.get(key))
            if value is not None:
                return value
        _, acc = self.series(ACC if phase == "public" else PRIVATE_ACC)
        return float(np.nanmax(acc)) if len(acc) else math.nan

    @property
    def measured_network(self) -> str:
        """Whose accuracy the run reports (its summary says; empty for runs that do not)."""
        value = self.summary.get("measured_network")
        return value if isinstance(value, str) else ""

    def last(self, key: str) -> float | None:
        _, values = self.series(key)
        return float(values[-1]) if len(values) else None


def load_runs(roots: str | Path | list, include_unfinished: bool = False,
              include_duplicates: bool = False) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Runs under ``roots`` (folders searched at any depth, links to folders followed, or run
    directories themselves), one per (setting, seed) unless ``include_duplicates``, and the run
    directories left out with the reason (unreadable, unfinished, or the same setting and seed as a
    run that is used). Each run is given its section and group (:mod:`fdlit.reporting.groups`)."""
    from fdlit.reporting.groups import sections

    roots = [Path(r) for r in ([roots] if isinstance(roots, (str, Path)) else roots)]
    for root in roots:
        if not root.is_dir():
            raise ConfigError("runs", f"{str(root)!r} is not a folder")
    where = ", ".join(repr(str(r)) for r in roots)
    candidates, skipped = [], []
    for path in run_directories(roots):
        try:
            config = read_config(path)
        except RunFileError as exc:  # a device, a link out of the folder, too large: refused unread
            skipped.append((path, exc.reason))
            continue
        except (OSError, yaml.YAMLError):
            skipped.append((path, "config.yaml unreadable"))
            continue
        try:
            summary, (metrics, unreadable) = _summary(path), read_jsonl_counted(path / METRICS)
        except RunFileError as exc:
            skipped.append((path, exc.reason))
            continue
        run = Run(path, config if isinstance(config, dict) else {}, metrics,
                  summary if isinstance(summary, dict) else {}, unreadable_lines=unreadable)
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
        refused = [f"{_relative(p, roots)}: {why}" for p, why in skipped if why not in ("unfinished", "no metrics")]
        raise ConfigError("runs", f"no {'' if include_unfinished else 'finished '}run directories "
                          f"(config.yaml + metrics.jsonl) under {where}"
                          + ("" if include_unfinished else "; --include_unfinished uses unfinished ones")
                          + (f"; left out: {'; '.join(refused[:3])}" if refused else ""))
    # runs that differ in anything but the studied knobs (e.g. two sweeps with different rounds in
    # one folder) are never pooled: the settings that tell them apart become part of the row label.
    # Each run is selected by its own rule; runs of one label selected by different rules (same
    # settings, but some summaries without a validation-selected number) are never pooled either.
    for section in sections(runs):
        rules: dict[str, set[str]] = defaultdict(set)
        for r in section.runs:
            rules[r.method].add(r.selection)
        for r in section.runs:
            if len(rules[r.method]) > 1:
                r.method += f" ({SELECTION_NAMES[r.selection]})"
    return runs, skipped


SELECTION_NAMES = {"validation": "validation-selected", "test": "test-best"}


def selection(runs: list[Run]) -> str:
    """How the numbers of these runs were chosen: ``validation``, ``test`` or ``mixed`` (each run by
    its own rule: validation-selected where it has a validation set, else its best test round)."""
    rules = {r.selection for r in runs}
    return rules.pop() if len(rules) == 1 else "mixed"


def accuracy_words(runs: list[Run]) -> str:
    """What ``Run.best`` is for these runs, in words for a caption or an axis."""
    return {"validation": "validation-selected", "test": "best",
            "mixed": "validation-selected (runs with a validation set) or best"}[selection(runs)]


def run_directories(roots: list[Path]) -> list[Path]:
    """Every folder holding ``metrics.jsonl`` under ``roots``, links to folders followed (each real
    folder once, so a loop of links ends); what a run's files link to is checked when read."""
    found, seen = [], set()
    for root in roots:
        for folder, dirs, files in os.walk(root, followlinks=True):
            real = os.path.realpath(folder)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = sorted(d for d in dirs if d != SWEEP_BOOKKEEPING)  # a sweep's own files, never a run
            if METRICS in files:
                found.append(Path(folder))
                # a run's own links are never followed: a run folder is read only for its own files
                dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
    return sorted(found)


def _relative(path: Path, roots: list[Path]) -> Path:
    """A path as the user named it: relative to the given folder that holds it."""
    for root in roots:
        if path.is_relative_to(root) and path != root:
            return path.relative_to(root)
    return path


def _summary(path: Path) -> dict:
    try:
        return read_summary(path)
    except RunFileError:
        raise
    except (OSError, ValueError):  # no summary yet (killed in its first round), or not JSON
        return {}


def shared_settings(runs: list[Run]) -> tuple[dict[str, Any], list[str]]:
    """(settings every run has in common, the keys that vary), without run names and folders."""
    flat = [_flatten(r.config) for r in runs]
    keys = [k for k in sorted(set().union(*flat)) if not k.startswith(("logger.", "checkpoint."))]
    shared = {k: flat[0].get(k) for k in keys if len({repr(f.get(k)) for f in flat}) == 1}
    # a knob some runs lack because their method has none (AVG and UWA have no τ) varies only when it
    # differs among the runs of one method that have it; the method itself is "aggregator"
    varying = set()
    for k in keys:
        if k not in shared and k.startswith("aggregator.init_args."):
            by_rule: dict[str, set[str]] = defaultdict(set)
            for f in flat:
                if k in f:
                    by_rule[repr(f.get("aggregator.class_path"))].add(repr(f[k]))
            if any(len(values) > 1 for values in by_rule.values()):
                varying.add(k)
        elif k not in shared:
            varying.add("aggregator" if k.startswith("aggregator") else k)
    return shared, sorted(varying)


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

