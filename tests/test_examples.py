"""The examples in examples/ run as a user runs them: by class path, from outside the package."""

import sys
from pathlib import Path

import pytest
import torch

from fdlit.config import parse_fit
from fdlit.runs.experiment import Experiment

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXECUTORS = {"sequential": "fdlit.execution.SequentialExecutor", "vectorized": "fdlit.execution.VectorizedExecutor",
             "ray": "fdlit.execution.RayExecutor"}


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as `cd examples` or PYTHONPATH=examples does


def tiny(tmp_path, *extra):
    return ["--config", "digits.yaml", "--config", str(EXAMPLES / "median_teacher.yaml"),
            "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path),
            "--federation.rounds", "2", "--federation.private_epochs_first", "2", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1", "--data.num_clients", "5", "--data.classes_per_client", "6",
            "--data.public_size", "120", "--model.hidden", "[16]", *extra]


def test_the_median_teacher_is_the_median_of_the_clients_probabilities(examples_on_path):
    from median_teacher import MedianTeacher

    probs = torch.tensor([[[0.7, 0.3]], [[0.6, 0.4]], [[0.1, 0.9]]])  # 3 clients, 1 sample, 2 classes
    result = MedianTeacher().aggregate([{"logits": p.log()} for p in probs], None)
    torch.testing.assert_close(result.teacher, torch.tensor([[0.6, 0.4]]))  # the outlier moves nothing


@pytest.mark.parametrize("executor", ["sequential", "vectorized", "ray"])
def test_the_median_teacher_runs_by_class_path_under_every_executor(executor, tmp_path, examples_on_path, request):
    extra = ["--federation.executor", EXECUTORS[executor]]
    if executor == "ray":
        request.getfixturevalue("ray_local")
        extra += ["--federation.executor.actor_executor", "sequential"]
    parser, cfg = parse_fit(tiny(tmp_path, *extra))
    loop = Experiment(cfg, parser).loop
    assert type(loop.aggregator).__module__ == "median_teacher" and "median_teacher" not in sys.modules["fdlit"].__dict__
    loop.fit()
    assert loop.round == 2 and loop.history[-1]["teacher/acc"] > 0.3  # most clients hold each class: the median knows it
