"""The privacy table: for runs that measure privacy (DP, the audits, secure aggregation), a row per
method and k with what each defence costs and what each attack still gets, mean ± std over seeds.

Columns (only those some run measured): accuracy (the same number as Table 1's after-public cell), the ε
spent by the last round (``privacy/epsilon``), the label-distribution attack's total-variation error from
the clients' public-set predictions (``privacy/label_tv``, mean over rounds; the uniform guess's error
beside it), the membership attack from those predictions (``privacy/upload_mia_auc``, its TPR at 1 % FPR)
and from the client models (``privacy/mia_auc``, the loss-threshold audit), all of the last round; bytes
each client sends a round and secure aggregation's seconds a round (``time/secagg_s``)."""

from __future__ import annotations

from fdlit.privacy.guarantee import MEANINGFUL_EPSILON
from fdlit.reporting.measure_table import MeasureTable, measure_table
from fdlit.reporting.runs import Run

MIB = 2**20


def _mean_over_rounds(run: Run, key: str) -> float | None:
    _, values = run.series(key)
    return float(values.mean()) if len(values) else None


# (column, how a run gives its number (None: not measured), decimals)
COLUMNS = (
    ("accuracy (%)", lambda r: 100 * r.best("public"), 2),
    ("ε", lambda r: r.last("privacy/epsilon"), 2),
    ("label TV error", lambda r: _mean_over_rounds(r, "privacy/label_tv"), 3),
    ("label TV, uniform guess", lambda r: _mean_over_rounds(r, "privacy/label_tv_chance"), 3),
    ("membership AUC, predictions", lambda r: r.last("privacy/upload_mia_auc"), 3),
    ("TPR at 1% FPR, predictions", lambda r: r.last("privacy/upload_mia_tpr_at_1fpr"), 3),
    ("membership AUC, model", lambda r: r.last("privacy/mia_auc"), 3),
    ("MiB up per client and round", lambda r: _scaled(_mean_over_rounds(r, "comm/up_bytes_per_client"), 1 / MIB), 3),
    ("secure aggregation s per round", lambda r: _mean_over_rounds(r, "time/secagg_s"), 3),
)
CAPTION = ("What each defence costs and what each attack still gets, mean ± std over seeds: accuracy as Table 1's "
           "after-public cell; ε spent by the last round (– without DP; above "
           f"{MEANINGFUL_EPSILON:g} it gives no meaningful guarantee); the label-distribution attack's "
           "total-variation error from a client's public-set predictions (mean over rounds and clients; the uniform "
           "guess beside it: below it, the attack learns something); the membership attack's AUC and TPR at 1 % FPR "
           "from those predictions and the loss-threshold audit's AUC on the client models (last round; 0.5 is "
           "chance); bytes each client sends a round; secure aggregation's seconds a round.")
PRIVACY_KEYS = ("privacy/epsilon", "privacy/label_tv", "privacy/upload_mia_auc", "privacy/mia_auc", "time/secagg_s")


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def measures_privacy(run: Run) -> bool:
    return any(m.get(key) is not None for m in run.metrics for key in PRIVACY_KEYS)


def privacy_table(runs: list[Run]) -> MeasureTable | None:
    """The table of the runs that measure privacy; None when none does. A method's runs without any
    privacy measurement (its plain baseline) get a row too, so the cost of each defence is read off."""
    measured = {r.method for r in runs if measures_privacy(r)}
    if not measured:
        return None
    return measure_table([r for r in runs if r.kind == "rule" and (r.method in measured or _base_of(r.method, measured))],
                         list(COLUMNS))


def _base_of(label: str, measured: set[str]) -> bool:
    """Whether ``label`` is a measured method's run without the defence ("[A] AVG" beside "[B] AVG")."""
    bare = label.split("] ", 1)[-1]
    return any(m.split("] ", 1)[-1] == bare for m in measured)
