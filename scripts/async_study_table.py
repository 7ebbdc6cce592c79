"""The time-to-accuracy table of docs/async.md from a folder of virtual-clock runs (sweeps/async.yaml,
sweeps/async_small.yaml): one row per method as ``fdlit report`` labels it (rule and clock), over its
finished runs, mean ± std over seeds of

* the mean global test accuracy after the public phase at the last round (``after_public/global_acc_mean``),
* the virtual seconds that round's teacher was released at (``time/virtual_s``),
* the first virtual time an evaluated round reached ``--threshold`` (the seeds that never did are counted),
* the uploads dropped by a deadline over the run (``participation/dropped_count``, summed),
* the largest staleness behind any teacher (``async/staleness_max``).

    python scripts/async_study_table.py runs/async_small --threshold 0.3
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from fdlit.reporting.runs import ACC, load_runs
from fdlit.reporting.write import VIRTUAL_TIME as TIME


def run_numbers(rows: list[dict], threshold: float) -> dict:
    """Final accuracy (%), its virtual time, first time at ``threshold`` (None: never), dropped uploads,
    max staleness of one run."""
    evaluated = [r for r in rows if _number(r.get(ACC)) and _number(r.get(TIME))]  # skipped rounds: null or NaN
    last = max(evaluated, key=lambda r: r["round"])
    reached = [r[TIME] for r in sorted(evaluated, key=lambda r: r["round"]) if r[ACC] >= threshold]
    return {"acc": 100 * last[ACC], "at": last[TIME], "first": reached[0] if reached else None,
            "dropped": sum(r.get("participation/dropped_count", 0) for r in rows),
            "staleness": max((r.get("async/staleness_max", 0.0) for r in rows), default=0.0)}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def mean_std(values: list[float], digits: int) -> str:
    """``mean ± std`` (sample std over seeds), or the mean alone for one value."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(root: Path, threshold: float, include_unfinished: bool = False) -> str:
    groups: dict[str, list[dict]] = {}
    runs, _ = load_runs([root], include_unfinished)
    for run in sorted(runs, key=lambda r: (r.method, r.seed)):
        groups.setdefault(run.method, []).append(run_numbers(run.metrics, threshold))
    lines = [f"| method | seeds | final accuracy (%) | at (virtual s) | first ≥ {100 * threshold:g} % (virtual s) "
             "| dropped uploads | max staleness |", "|---|---|---|---|---|---|---|"]
    for group, runs in groups.items():
        firsts = [r["first"] for r in runs if r["first"] is not None]
        first = mean_std(firsts, 1) if firsts else "not reached"
        if firsts and len(firsts) < len(runs):
            first += f" ({len(firsts)} of {len(runs)} seeds)"
        lines.append(f"| {group} | {len(runs)} | {mean_std([r['acc'] for r in runs], 1)} "
                     f"| {mean_std([r['at'] for r in runs], 1)} | {first} "
                     f"| {mean_std([r['dropped'] for r in runs], 1)} | {mean_std([r['staleness'] for r in runs], 0)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="folder of run directories (a sweep's runs/<name>)")
    parser.add_argument("--threshold", type=float, default=0.3, help="accuracy (0 to 1) for the time-to-accuracy "
                        "column")
    parser.add_argument("--include-unfinished", action="store_true", help="also runs that have not finished "
                        "(their last logged round is their 'final' one)")
    args = parser.parse_args()
    if not math.isfinite(args.threshold) or not 0 < args.threshold <= 1:
        parser.error("--threshold: a number in (0, 1]")
    print(table(args.runs, args.threshold, args.include_unfinished))


if __name__ == "__main__":
    main()
