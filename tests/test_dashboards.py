import sys
import types

import numpy as np
import pytest
import torch

from fdlit.federation.diagnostics import trust_matrix
from fdlit.runs import LoggerConfig, WandbLogger
from fdlit.runs.dashboards import (
    MISSING_GREY,
    VIRIDIS,
    client_rows,
    png_to_array,
    run_summary,
    trust_heatmap_array,
    trust_heatmap_png,
    trust_rows,
    wandb_round_payload,
)

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


def test_round_heatmap_array_shows_weights_own_classes_and_missing_rows():
    matrix = [[0.0, 0.5, 1.0], [None, None, None], [0.25, 0.25, 0.5]]
    image, top = trust_heatmap_array(matrix, [[0], [1], [2]], cell=8)
    assert image.shape == (24, 24, 3) and image.dtype == np.uint8 and top == 1.0
    corner = image[0::8, 0::8]  # the top-left pixel of every cell: the colour, beside any dot
    assert corner[0, 0].tolist() == VIRIDIS[0].tolist() and corner[0, 2].tolist() == VIRIDIS[-1].tolist()
    assert (corner[1] == MISSING_GREY).all()  # a client that sent nothing
    centre = image[4::8, 4::8]  # the middle pixel of every cell: white on own classes only
    assert [(i, j) for i in range(3) for j in range(3) if (centre[i, j] == 255).all()] == [(0, 0), (1, 1), (2, 2)]
    # a dot stays inside its cell: the cell's edges keep their colour, so neighbouring dots never merge
    assert (image[16, 16:] == image[16, 16]).all() and not (image[16, 16] == 255).all()


def test_payload_uses_real_wandb_table_and_image():
    wandb = pytest.importorskip("wandb")
    payload = wandb_round_payload(wandb, METRICS, [[0, 1], [2]])
    assert "clients/accuracy" not in payload  # no new table artifact each round: one at the end
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
    loop = types.SimpleNamespace(client_data=[types.SimpleNamespace(classes=[0, 1]), types.SimpleNamespace(classes=[2])],
                                 round=0, rounds=12, history=[])
    logger.on_fit_start(loop)
    assert run.defined["*"] == ("round", None)  # round is the x-axis of everything
    # summaries are written as plain numbers at the end, not as W&B's {"max": x} dicts
    assert run.defined["after_public/global_acc_mean"] == ("round", None)
    for r in range(1, 13):
        loop.history.append({**METRICS, "round": r, "after_public/global_acc_mean": 0.5 - abs(r - 4) / 100})
        logger.on_round_end(loop, r, loop.history[-1])
    with_trust = [m["round"] for m in run.logged if "clients/trust_matrix" in m]
    assert with_trust == [1, 5, 10, 12]  # round 1, every 5th, the last
    assert all("clients/accuracy" not in m for m in run.logged)
    logged = run.logged[0]
    assert logged["clients/trust_matrix"][0] == "image" and "round 1" in logged["clients/trust_matrix"][2]
    assert logged["teacher/acc"] == 0.7 and logged["comm/up_bytes_total"] == 1000
    logger.on_fit_end(loop, {"rounds": 12})
    table = run.logged[-1]["clients/accuracy"]  # one table, every round's rows
    assert table[0] == "table" and table[1][:3] == ["round", "client", "classes"] and len(table[2]) == 24
    assert run.summary["after_public/global_acc_mean"] == pytest.approx(0.42)  # the last value
    assert run.summary["best/after_public/global_acc_mean"] == pytest.approx(0.5)  # the best, round 4
    assert run.summary["final/rounds"] == 12


def test_trust_heatmap_rows_stay_few_at_many_clients():
    rng = np.random.default_rng(0)
    classes = [sorted(rng.choice(10, 2, replace=False).tolist()) for _ in range(500)]
    matrix = rng.random((500, 10)).tolist()
    rows, labels, boxes, ylabel = trust_rows(matrix, classes, max_rows=40)
    assert rows.shape == (10, 10) and boxes == [(c, c) for c in range(10)]
    holders = [i for i, held in enumerate(classes) if 3 in held]
    assert rows[3] == pytest.approx(np.mean(np.array(matrix)[holders], axis=0))
    assert labels[3] == f"3 ({len(holders)})" and "500" in ylabel
    few, labels, boxes, _ = trust_rows(matrix[:20], classes[:20], max_rows=40)  # few clients: one row each
    assert few.shape == (20, 10) and (0, classes[0][0]) in boxes
    png = trust_heatmap_png(matrix, "round 5", classes)
    assert png_to_array(png).shape[0] < 600  # not a 14,000-pixel-high picture


def test_run_summary_holds_plain_last_and_best_numbers():
    history = [{"after_public/global_acc_mean": 0.3, "weights/chi": 0.5, "comm/up_bytes_total": 10},
               {"after_public/global_acc_mean": 0.6, "weights/chi": 0.4, "comm/up_bytes_total": 20},
               {"after_public/global_acc_mean": float("nan"), "comm/up_bytes_total": 30},
               {"after_public/global_acc_mean": 0.5, "weights/chi": 0.2, "comm/up_bytes_total": 40}]
    summary = run_summary(history)
    assert summary == {"after_public/global_acc_mean": 0.5, "best/after_public/global_acc_mean": 0.6,
                       "weights/chi": 0.2, "comm/up_bytes_total": 40.0}
    assert all(type(v) is float for v in summary.values())


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
