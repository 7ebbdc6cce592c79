"""What the W&B dashboard shows per round, built from the loop's metrics dict.

The wandb module is passed in (``wandb_round_payload(wandb, ...)``) so that wandb_logger.py stays
the only module importing it. The per-round heatmap is drawn with NumPy (matplotlib's import and a
figure cost more CPU than W&B's whole logging); the report's labelled figure uses matplotlib's object
API with the Agg canvas: no pyplot global state, no display needed.
"""

from __future__ import annotations

import io
from typing import Any, Optional, Sequence

import numpy as np

CLIENT_COLUMNS = ("after_private/global_acc", "after_private/local_acc",
                  "after_public/global_acc", "after_public/local_acc")
TRUST_KEY = "clients/trust_matrix"

# (metric, best) pairs: the run summary holds each metric's last value under its own name (the name
# a sweep file's ``metric`` uses) and, for accuracies, the best as ``best/<metric>``; all plain numbers
SUMMARIES = (
    ("after_private/global_acc_mean", "max"), ("after_private/local_acc_mean", "max"),
    ("after_public/global_acc_mean", "max"), ("after_public/local_acc_mean", "max"),
    ("after_private/val_acc_mean", "max"), ("after_public/val_acc_mean", "max"),
    ("teacher/acc", "max"), ("weights/chi", None),
    ("comm/up_bytes_total", None), ("comm/down_bytes_total", None),
)
TRUST_MAX_ROWS = 40  # more clients than this: one row per class held (clients aggregated)
# matplotlib's viridis at 0, 1/8, ..., 1 (RGB), interpolated linearly between
VIRIDIS = np.array([[68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140], [40, 174, 128],
                    [94, 201, 98], [173, 220, 48], [253, 231, 37]], dtype=float)
MISSING_GREY = 128


def run_summary(history: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Last and best values as plain numbers (W&B's ``define_metric(summary=...)`` stores a dict
    such as ``{"max": x}``, which a sweep's metric and the console summary do not read)."""
    out: dict[str, float] = {}
    for metric, best in SUMMARIES:
        values = [float(m[metric]) for m in history
                  if isinstance(m.get(metric), (int, float)) and np.isfinite(m[metric])]
        if values:
            out[metric] = values[-1]
            if best == "max":
                out[f"best/{metric}"] = max(values)
    return out


def accuracy_table_rows(history: Sequence[dict[str, Any]],
                        client_classes: Sequence[Sequence[int]]) -> tuple[list[str], list[list]]:
    """Per-client accuracies of every evaluated round in one table (logged once, at the end)."""
    rows = []
    for metrics in history:
        if metrics.get("eval/test_samples", 1) == 0:
            continue
        columns, per_round = client_rows(metrics, client_classes)
        rows += [[metrics.get("round"), *row] for row in per_round]
    return ["round", "client", "classes", *CLIENT_COLUMNS], rows


def trust_rows(matrix: Sequence[Sequence[Optional[float]]], client_classes: Optional[Sequence[Sequence[int]]],
               max_rows: int = TRUST_MAX_ROWS) -> tuple[np.ndarray, list[str], list[tuple[int, int]], str]:
    """The heatmap's rows, labels, marked (row, class) cells and y label. Up to ``max_rows`` clients:
    one row per client, its own classes marked. More: one row per class c, the mean weight of the
    clients holding c on each true class (a client with k classes counts in k rows), so the own-class
    diagonal is marked and the picture stays C rows high at any M."""
    m = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    n_clients, n_classes = m.shape
    classes = list(client_classes or [])
    if n_clients <= max_rows or len(classes) != n_clients:
        boxes = [(i, c) for i, held in enumerate(classes) for c in held]
        return m, [str(i) for i in range(n_clients)], boxes, "client"
    rows = np.full((n_classes, n_classes), np.nan)
    counts = []
    for c in range(n_classes):
        holders = [i for i, held in enumerate(classes) if c in held]
        counts.append(len(holders))
        if holders:
            with np.errstate(all="ignore"):
                rows[c] = np.nanmean(m[holders], axis=0) if np.isfinite(m[holders]).any() else np.nan
    labels = [f"{c} ({n})" for c, n in enumerate(counts)]
    return rows, labels, [(c, c) for c in range(n_classes)], f"clients holding class (count), of {n_clients}"


def client_rows(metrics: dict[str, Any], client_classes: Sequence[Sequence[int]]) -> tuple[list[str], list[list]]:
    """Per-client accuracy table: one row per client, with the classes it holds."""
    columns = ["client", "classes", *CLIENT_COLUMNS]
    cols = [metrics.get(f"clients/{c}") or [] for c in CLIENT_COLUMNS]
    rows = []
    for i in range(max((len(c) for c in cols), default=0)):
        classes = " ".join(str(c) for c in client_classes[i]) if i < len(client_classes) else ""
        rows.append([i, classes, *[c[i] if i < len(c) else None for c in cols]])
    return columns, rows


def trust_heatmap_png(matrix: Sequence[Sequence[Optional[float]]], title: str = "",
                      client_classes: Optional[Sequence[Sequence[int]]] = None, dpi: int = 80,
                      max_rows: int = TRUST_MAX_ROWS) -> bytes:
    """Heatmap of the who-to-trust matrix as PNG bytes (at most ``max(max_rows, C)`` rows, see
    ``trust_rows``); a dot on a client's own classes."""
    from matplotlib.figure import Figure

    n_rows, n_classes = trust_rows(matrix, client_classes, max_rows)[0].shape
    fig = Figure(figsize=(1.8 + 0.45 * n_classes, 1.2 + 0.28 * n_rows), dpi=dpi)
    ax = fig.add_subplot()
    draw_trust_heatmap(fig, ax, matrix, client_classes, max_rows)
    ax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def draw_trust_heatmap(fig, ax, matrix: Sequence[Sequence[Optional[float]]],
                       client_classes: Optional[Sequence[Sequence[int]]] = None,
                       max_rows: int = TRUST_MAX_ROWS) -> None:
    """The who-to-trust heatmap on ``ax`` with its colour bar; a client's own classes marked with a
    dot (white, dark rim: seen on any colour). Boxes would merge into a maze where a client holds
    neighbouring classes (k = 5 of 10), and the dots show whether clients are trusted on what they hold."""
    m, labels, boxes, ylabel = trust_rows(matrix, client_classes, max_rows)
    n_rows, n_classes = m.shape
    top = float(np.nanmax(m)) if np.isfinite(m).any() else 1.0
    image = ax.imshow(m, aspect="auto", cmap="viridis", vmin=0.0, vmax=max(top, 1e-9))
    fig.colorbar(image, ax=ax, label="mean weight")
    if boxes:
        box = ax.get_position()  # a dot a third of a cell wide, whatever the figure's size
        cell_pt = 72 * min(box.width * fig.get_figwidth() / n_classes, box.height * fig.get_figheight() / n_rows)
        ax.autoscale(False)  # the image's extent stays the axes' limits
        rows, classes = zip(*boxes)
        ax.scatter(classes, rows, s=(cell_pt / 3) ** 2, marker="o", facecolor="white", edgecolor="#222222",
                   linewidth=0.5, zorder=3, label="own class")
    ax.set_xlabel("true class of public sample")
    ax.set_ylabel(ylabel)
    ax.set_xticks(range(n_classes))
    ax.set_yticks(range(n_rows), labels)


def trust_heatmap_array(matrix: Sequence[Sequence[Optional[float]]],
                        client_classes: Optional[Sequence[Sequence[int]]] = None, max_rows: int = TRUST_MAX_ROWS,
                        cell: int = 16) -> tuple[np.ndarray, float]:
    """The heatmap of ``trust_heatmap_png`` without its text, as an RGB array (``cell`` pixels per
    entry, rows and classes in order, a white dot with a dark rim on a client's own classes, grey where
    a client sent nothing), and the weight that maps to the top of the colour scale (0 maps to its
    bottom). Dots, not outlines: outlines of neighbouring own classes (k = 5 of 10) merge into a maze."""
    m, _, boxes, _ = trust_rows(matrix, client_classes, max_rows)
    top = float(np.nanmax(m)) if np.isfinite(m).any() else 1.0
    scaled = np.clip(np.nan_to_num(m, nan=0.0) / max(top, 1e-9), 0.0, 1.0) * (len(VIRIDIS) - 1)
    low = np.minimum(scaled.astype(int), len(VIRIDIS) - 2)
    frac = (scaled - low)[..., None]
    rgb = VIRIDIS[low] * (1 - frac) + VIRIDIS[low + 1] * frac
    rgb[~np.isfinite(m)] = MISSING_GREY
    image = np.repeat(np.repeat(np.rint(rgb).astype(np.uint8), cell, 0), cell, 1)
    offset = np.arange(cell) + 0.5 - cell / 2
    distance = np.hypot(*np.meshgrid(offset, offset, indexing="ij"))
    radius = cell / 5
    disc, rim = distance <= radius, (distance > radius) & (distance <= radius + max(1.0, cell / 16))
    for i, c in boxes:
        block = image[i * cell:(i + 1) * cell, c * cell:(c + 1) * cell]
        block[rim], block[disc] = 34, 255
    return image, top


def png_to_array(png: bytes) -> np.ndarray:
    from matplotlib.image import imread

    return (imread(io.BytesIO(png), format="png")[..., :3] * 255).astype(np.uint8)


def wandb_round_payload(wandb: Any, metrics: dict[str, Any], client_classes: Sequence[Sequence[int]],
                        trust: bool = True, max_rows: int = TRUST_MAX_ROWS) -> dict[str, Any]:
    """Scalars as they are (accuracies only in rounds that evaluated) and, when ``trust``, the trust
    matrix as a heatmap ``wandb.Image``. Per-client lists are not logged per round (as histograms
    they are opaque, as tables each round would be a new artifact): ``accuracy_table_rows`` makes one
    table at the end."""
    payload = {k: v for k, v in metrics.items() if not isinstance(v, (list, tuple))}
    if metrics.get("eval/test_samples", 1) == 0:  # a round without evaluation: no accuracy points at all
        payload = {k: v for k, v in payload.items() if not k.startswith(("after_private/", "after_public/"))}
    matrix = metrics.get(TRUST_KEY)
    if matrix and trust:
        r = metrics.get("round")
        image, top = trust_heatmap_array(matrix, client_classes, max_rows=max_rows)
        rows = "client" if len(matrix) <= max_rows or len(client_classes) != len(matrix) else "class held (its clients)"
        payload[TRUST_KEY] = wandb.Image(image, caption=(
            f"who to trust, round {r}: mean weight per {rows} (rows, top to bottom) x true class (columns, "
            f"left to right); viridis from 0 to {top:.3g}, white dots: own classes, grey: nothing sent"))
    return payload
