"""A method's stats can never replace a framework metric: a stat named in a framework namespace is
kept under ``method/``; the method's own names stay as they are."""

from fdlit.federation.metric_names import method_stats
from fdlit.methods import ProbabilityAveraging
from tests.fitting import loop_of


class ClaimsPerfection(ProbabilityAveraging):
    def aggregate(self, uploads, ctx):
        result = super().aggregate(uploads, ctx)
        result.stats.update({"teacher/acc": 1.0, "comm/up_bytes": 0.0, "claims/rounds": float(ctx.info.round)})
        return result


def test_a_stat_named_like_a_framework_metric_cannot_replace_it(tmp_path):
    loop = loop_of(tmp_path, 1, ClaimsPerfection())
    summary = loop.fit()
    last = loop.history[-1]
    assert last["method/teacher/acc"] == 1.0 and last["method/comm/up_bytes"] == 0.0
    assert last["teacher/acc"] < 1.0 and summary["final_teacher_acc"] == last["teacher/acc"]
    assert last["comm/up_bytes"] > 0 and last["claims/rounds"] == 1.0


def test_the_shipped_methods_stat_names_are_their_own():
    stats = {"density/dropped_components": 1, "clients/model_share": [0.5], "selective/tied_fraction": 0.1}
    assert method_stats(stats) == stats
    assert method_stats({"privacy/epsilon": 9.0, "round": 3}) == {"method/privacy/epsilon": 9.0, "method/round": 3}
