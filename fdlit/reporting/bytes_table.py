"""The bytes table: what a method's accuracy costs in communication, a row per method and k, mean ± std
over seeds (the digits counterpart of Kovalchuk et al. 2026, Sec. 5.4, which sets FD's bytes against
SCAFFOLD's).

Accuracy is the mean global test accuracy after each evaluated round's last phase
(``after_public/global_acc_mean``: after distillation for FD, the averaged model for parameter exchange);
bytes are the run's cumulative ledger (``comm/up_bytes_total``, ``comm/down_bytes_total``, round 0's set-up
messages included) per client (over ``data.num_clients``), 1 MB = 10⁶ bytes as in the paper. "Reaches 95 %
of its best": the first evaluated round whose accuracy is at least 95 % of the run's best, the paper's
sense of "converges in 5 rounds"; the MB column is the cumulative cost per client up to that round."""

from __future__ import annotations

import numpy as np

from fdlit.reporting.labels import _number, _section
from fdlit.reporting.measure_table import Column, MeasureTable, evaluated_accuracy, measure_table
from fdlit.reporting.runs import Run

MB = 1e6
UP, DOWN = "comm/up_bytes_total", "comm/down_bytes_total"
CAPTION = ("Accuracy against bytes, mean ± std over seeds: the mean global test accuracy (%) after the last "
           "round and at the best round (test-best, after each round's last phase); the first round that reaches "
           "95 % of the run's best and the cumulative MB per client (up + down, set-up included, 10⁶ bytes) up to "
           "it; the MB per client sent up and down over the whole run.")


def _clients(run: Run) -> float | None:
    m = _number(_section(run.config, "data").get("num_clients"))
    return m if m and m > 0 else None


def _reach(run: Run) -> tuple[float, float] | None:
    """(round, cumulative MB per client) of the first evaluated round at 95 % of the run's best."""
    rounds, acc = evaluated_accuracy(run)
    m = _clients(run)
    if not len(acc) or m is None:
        return None
    first = int(np.argmax(acc >= 0.95 * acc.max()))
    bytes_at = {}
    for key in (UP, DOWN):
        at, values = run.series(key)
        bytes_at[key] = dict(zip(at.tolist(), values.tolist(), strict=True)).get(float(rounds[first]))
    if None in bytes_at.values():
        return float(rounds[first]), float("nan")
    return float(rounds[first]), (bytes_at[UP] + bytes_at[DOWN]) / m / MB


def _total(key: str):
    def value(run: Run) -> float | None:
        total, m = run.last(key), _clients(run)
        return None if total is None or m is None else total / m / MB
    return value


def _accuracy(which: str):
    def value(run: Run) -> float | None:
        _, acc = evaluated_accuracy(run)
        return None if not len(acc) else 100 * float(acc[-1] if which == "last" else acc.max())
    return value


COLUMNS: list[Column] = [
    ("accuracy after the last round (%)", _accuracy("last"), 2),
    ("best accuracy (%)", _accuracy("best"), 2),
    ("rounds to 95 % of best", lambda r: (_reach(r) or (None,))[0], 1),
    ("MB per client to 95 % of best", lambda r: (_reach(r) or (None, None))[1], 3),
    ("MB per client up", _total(UP), 3),
    ("MB per client down", _total(DOWN), 3),
]


def bytes_table(runs: list[Run]) -> MeasureTable | None:
    """The table of the runs that log their communication; None when none does."""
    logged = [r for r in runs if r.last(UP) is not None and r.last(DOWN) is not None]
    return measure_table(logged, COLUMNS) if logged else None
