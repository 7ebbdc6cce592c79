import sys
import types

import numpy as np
import pytest
import torch

from fdlit.federation.diagnostics import trust_matrix
from fdlit.runs import LoggerConfig, WandbLogger
from fdlit.runs.dashboards import client_rows, png_to_array, trust_heatmap_png, wandb_round_payload

METRICS = {
    "round": 3, "after_public/global_acc_mean": 0.5, "weights/chi": 0.4, "teacher/acc": 0.7,
    "comm/up_bytes_total": 1000,
    "clients/after_private/global_acc": [0.1, 0.2], "clients/after_private/local_acc": [0.9, 0.8],
    "clients/after_public/global_acc": [0.3, 0.4], "clients/after_public/local_acc": [0.7, 0.6],
    "clients/trust_matrix": [[0.75, None, 0.0], [0.25, None, 1.0]],
}


def test_trust_matrix_is_mean_weight_per_true_class():
    # 2 clients, 4 public samples of classes 0, 0, 2, 2; class 1 has no public sample
    w = torch.tensor([[1.0, 0.5, 0.0, 0.0], [0.0, 0.5, 1.0, 1.0]])
    y = torch.tensor([0, 0, 2, 2])
    assert trust_matrix(w, y, 3) == [[0.75, None, 0.0], [0.25, None, 1.0]]


def test_client_table_rows_carry_each_clients_classes():
    columns, rows = client_rows(METRICS, [[0, 1], [2]])
    assert columns[:2] == ["client", "classes"]
    assert rows == [[0, "0 1", 0.1, 0.9, 0.3, 0.7], [1, "2", 0.2, 0.8, 0.4, 0.6]]


def test_trust_heatmap_is_a_png_image():
    png = trust_heatmap_png(METRICS["clients/trust_matrix"], "round 3", [[0], [2]])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    array = png_to_array(png)
    assert array.ndim == 3 and array.shape[2] == 3 and array.dtype == np.uint8 and array.std() > 0


def test_payload_uses_real_wandb_table_and_image():
    wandb = pytest.importorskip("wandb")
    payload = wandb_round_payload(wandb, METRICS, [[0, 1], [2]])
    assert isinstance(payload["clients/accuracy"], wandb.Table)
    assert payload["clients/accuracy"].data[1][:2] == [1, "2"]
    assert isinstance(payload["clients/trust_matrix"], wandb.Image)
    assert payload["round"] == 3 and payload["weights/chi"] == 0.4
    assert not any(isinstance(v, list) for v in payload.values())  # no raw lists reach run.log


class FakeRun:
    def __init__(self):
        self.defined, self.logged, self.summary, self.dir = {}, [], {}, "/tmp"

    def define_metric(self, name, step_metric=None, summary=None, **_):
        self.defined[name] = (step_metric, summary)

    def log(self, data):
        self.logged.append(data)

    def finish(self):
        pass


def test_wandb_logger_dashboard_wiring(monkeypatch, tmp_path):
    run = FakeRun()
    fake = types.SimpleNamespace(init=lambda **kw: run, Table=lambda columns, data: ("table", columns, data),
                                 Image=lambda array, caption: ("image", array.shape, caption),
                                 Settings=lambda **kw: types.SimpleNamespace(**kw))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    logger = WandbLogger(LoggerConfig(mode="offline"), {}, tmp_path, "run")
    loop = types.SimpleNamespace(client_data=[types.SimpleNamespace(classes=[0, 1]), types.SimpleNamespace(classes=[2])])
    logger.on_fit_start(loop)
    assert run.defined["*"] == ("round", None)  # round is the x-axis of everything
    assert run.defined["after_public/global_acc_mean"] == ("round", "max")
    assert run.defined["teacher/acc"] == ("round", "max")
    assert run.defined["weights/chi"][0] == "round" and run.defined["comm/up_bytes_total"] == ("round", "last")
    logger.on_round_end(loop, 3, METRICS)
    (logged,) = run.logged
    assert logged["clients/accuracy"][0] == "table" and len(logged["clients/accuracy"][2]) == 2
    assert logged["clients/trust_matrix"][0] == "image" and "round 3" in logged["clients/trust_matrix"][2]
    assert logged["teacher/acc"] == 0.7 and logged["comm/up_bytes_total"] == 1000


def test_a_round_without_evaluation_logs_no_accuracy_points():
    fake = types.SimpleNamespace(Table=lambda columns, data: ("table", columns, data),
                                 Image=lambda array, caption: ("image", array.shape, caption))
    skipped = {"round": 3, "after_public/global_acc_mean": float("nan"), "after_private/local_acc_max": float("nan"),
               "teacher/acc": 0.7, "eval/test_samples": 0}
    payload = wandb_round_payload(fake, skipped, [[0, 1], [2]])
    assert payload == {"round": 3, "teacher/acc": 0.7, "eval/test_samples": 0}
    evaluated = wandb_round_payload(fake, {**skipped, "after_public/global_acc_mean": 0.5, "eval/test_samples": 100},
                                    [[0, 1], [2]])
    assert evaluated["after_public/global_acc_mean"] == 0.5
