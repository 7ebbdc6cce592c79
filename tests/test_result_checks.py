"""The framework checks every method's math: a teacher whose rows do not sum to 1, or weights
normalised over samples instead of clients, stop the run at round 1 in one line naming the method and
the check, under every executor; a teacher that declares itself a logit teacher is accepted."""

import re
import textwrap

import pytest
import torch

from fdlit.cli import main
from fdlit.federation.result_checks import check_result
from fdlit.methods import ProbabilityAveraging
from fdlit.methods.base import AggregationResult

OUTSIDE_METHODS = '''
import torch
from fdlit.methods import ProbabilityAveraging
from fdlit.methods.base import AggregationResult


class RowsSumToTen(ProbabilityAveraging):
    """AVG's teacher times ten: rows sum to 10."""

    def aggregate(self, uploads, ctx):
        result = super().aggregate(uploads, ctx)
        return AggregationResult(teacher=result.teacher * 10, weights=result.weights)


class WeightsOverSamples(ProbabilityAveraging):
    """AVG with weights normalised over the public samples instead of over the clients."""

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        m, n, _ = z.shape
        return AggregationResult(teacher=z.softmax(-1).mean(0), weights=torch.full((m, n), 1.0 / n))


class MeanLogitsTeacher(ProbabilityAveraging):
    """The clients' mean logits as the teacher, declared as a logit teacher."""

    teacher_space = "logits"

    def aggregate(self, uploads, ctx):
        return AggregationResult(teacher=self.stack_logits(uploads).float().mean(0))
'''

EXECUTORS = {"sequential": "fdlit.execution.SequentialExecutor", "vectorized": "fdlit.execution.VectorizedExecutor"}


@pytest.fixture
def outside(tmp_path, monkeypatch):
    (tmp_path / "outside_rules.py").write_text(textwrap.dedent(OUTSIDE_METHODS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def run(tmp_path, method, executor):
    return main(["fit", "--config", "digits.yaml", "--aggregator", f"outside_rules.{method}",
                 "--federation.executor", EXECUTORS[executor], "--logger.mode", "disabled",
                 "--logger.progress", "false", "--logger.run_dir", str(tmp_path / "runs"), "--federation.rounds", "1",
                 "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
                 "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "60",
                 "--model.hidden", "[8]"])


@pytest.mark.parametrize("executor", list(EXECUTORS))
@pytest.mark.parametrize(("method", "says"), [
    ("RowsSumToTen", r"RowsSumToTen's aggregate returned a probability teacher whose row \d+ sums to 10 "),
    ("WeightsOverSamples", r"WeightsOverSamples's aggregate returned weights whose column \d+ sums to 0.0666667 over the clients"),
])
def test_a_wrong_result_stops_the_run_in_one_line(outside, capsys, method, says, executor):
    assert run(outside, method, executor) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("fdlit: error: aggregator: ") and re.search(says, err[0]), err[0]


@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_a_declared_logit_teacher_is_accepted(outside, capsys, executor):
    assert run(outside, "MeanLogitsTeacher", executor) == 0
    assert "fdlit summary" in capsys.readouterr().out


def avg_result(m=3, n=5, c=4):
    z = torch.randn(m, n, c)
    return AggregationResult(teacher=z.softmax(-1).mean(0), weights=torch.full((m, n), 1.0 / m))


@pytest.mark.parametrize(("change", "says"), [
    (lambda r: setattr(r, "teacher", r.teacher[:-1]), "a teacher of shape (4, 4)"),
    (lambda r: setattr(r, "teacher", r.teacher - 0.3), "a negative entry"),
    (lambda r: r.teacher.__setitem__((2, 1), float("nan")), "NaN or inf"),
    (lambda r: setattr(r, "weights", r.weights[:2]), "weights of shape (2, 5)"),
    (lambda r: r.weights.__setitem__((0, 0), -0.5), "a negative weight"),
    (lambda r: setattr(r, "keep", torch.ones(4, dtype=torch.bool)), "a keep mask of shape (4,)"),
])
def test_each_check_fails_on_its_fault(change, says):
    result = avg_result()
    check_result(ProbabilityAveraging(), result, 3, 5, 4)  # a correct result passes
    change(result)
    with pytest.raises(ValueError, match="aggregator: ProbabilityAveraging's aggregate returned") as err:
        check_result(ProbabilityAveraging(), result, 3, 5, 4)
    assert says in str(err.value)


def test_only_the_kept_rows_are_checked():
    result = avg_result()
    result.keep = torch.tensor([True, True, False, True, False])
    result.teacher[2] = 0.0  # a dropped row may hold anything finite the rule left there
    result.weights[:, 4] = 0.0
    check_result(ProbabilityAveraging(), result, 3, 5, 4)
    result.teacher[1] = 0.0
    with pytest.raises(ValueError, match="row 1 sums to 0"):
        check_result(ProbabilityAveraging(), result, 3, 5, 4)


def test_the_cost_benchmark_runs():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(repo / "benchmarks" / "result_checks.py"), "--repeats", "1"],
                         capture_output=True, text=True, cwd=repo, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [(s, rule) for s in ("digits", "fashion-mnist", "cifar-100")
                                            for rule in ("AVG", "sUWA")]
    assert all(float(r[-1]) >= 0 for r in rows)
