"""The round-budget table (``fdlit report --budgets [5,10]``): each method's best mean global test accuracy
after the public phase within its first R rounds, a column per R, a row per method and k, mean ± std over
seeds. A run's first R rounds are an R-round run wherever no schedule depends on the total number of rounds,
so one sweep gives every shorter budget. Rounds that were not evaluated do not count."""

from __future__ import annotations

from fdlit.reporting.measure_table import MeasureTable, evaluated_accuracy, measure_table
from fdlit.reporting.runs import Run


def caption(budgets: list[int]) -> str:
    within = ", ".join(f"R = {b}" for b in budgets)
    return (f"Best mean global test accuracy (%) after the public phase within the first R rounds ({within}; "
            "test-best within the budget), mean ± std over seeds.")


def _best_within(budget: int):
    def value(run: Run) -> float | None:
        rounds, acc = evaluated_accuracy(run)
        within = acc[rounds <= budget]
        return 100 * float(within.max()) if len(within) else None
    return value


def budget_table(runs: list[Run], budgets: list[int]) -> MeasureTable | None:
    """None without budgets, or when no run was evaluated within any of them."""
    if not budgets:
        return None
    return measure_table(runs, [(f"R = {b}", _best_within(b), 2) for b in budgets])
