"""scripts/async_study_table.py: a run's final accuracy is its last evaluated round's, with that round's
virtual time; time to accuracy is the first evaluated round at the threshold; dropped uploads add up over
rounds; rounds left unevaluated (null or NaN) count for none of them; groups show mean ± sample std."""

import importlib.util
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("async_study_table", REPO / "scripts" / "async_study_table.py")
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)

ACC, TIME = "after_public/global_acc_mean", "time/virtual_s"


def rows():
    return [
        {"round": 1, ACC: 0.15, TIME: 10.0, "participation/dropped_count": 3, "async/staleness_max": 0.0},
        {"round": 2, ACC: None, TIME: 20.0, "participation/dropped_count": 1, "async/staleness_max": 4.0},
        {"round": 3, ACC: 0.31, TIME: 30.0, "async/staleness_max": 2.0},
        {"round": 4, ACC: 0.29, TIME: 40.0, "participation/dropped_count": 2},
        {"round": 5, ACC: math.nan, TIME: 50.0},
    ]


def test_a_run_s_numbers_come_from_its_evaluated_rounds():
    numbers = table.run_numbers(rows(), threshold=0.3)
    assert numbers["acc"] == 100 * 0.29 and numbers["at"] == 40.0  # round 5 was not evaluated
    assert numbers["first"] == 30.0
    assert numbers["dropped"] == 6 and numbers["staleness"] == 4.0
    assert table.run_numbers(rows(), threshold=0.5)["first"] is None


def test_groups_show_mean_and_sample_std_or_one_value():
    assert table.mean_std([20.0, 22.0, 24.0], 1) == "22.0 ± 2.0"
    assert table.mean_std([7.0], 0) == "7"
