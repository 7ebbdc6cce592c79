"""What the W&B dashboard shows per round, built from the loop's metrics dict.

The wandb module is passed in (``wandb_round_payload(wandb, ...)``) so that wandb_logger.py stays
the only module importing it. Plotting uses matplotlib's object API with the Agg canvas: no pyplot
global state, no display needed.
"""

from __future__ import annotations

import io
from typing import Any, Optional, Sequence

import numpy as np

CLIENT_COLUMNS = ("after_private/global_acc", "after_private/local_acc",
                  "after_public/global_acc", "after_public/local_acc")
TRUST_KEY = "clients/trust_matrix"

# (metric, summary) pairs the W&B logger declares, all on the ``round`` x-axis
SUMMARIES = (
    ("after_private/global_acc_mean", "max"), ("after_private/local_acc_mean", "max"),
    ("after_public/global_acc_mean", "max"), ("after_public/local_acc_mean", "max"),
    ("after_private/val_acc_mean", "max"), ("after_public/val_acc_mean", "max"),
    ("teacher/acc", "max"), ("weights/chi", "mean"),
    ("comm/up_bytes_total", "last"), ("comm/down_bytes_total", "last"),
)


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
                      client_classes: Optional[Sequence[Sequence[int]]] = None, dpi: int = 100) -> bytes:
    """Heatmap of the M x C who-to-trust matrix as PNG bytes; a client's own classes are boxed."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    m = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    n_clients, n_classes = m.shape
    fig = Figure(figsize=(1.6 + 0.45 * n_classes, 1.2 + 0.28 * n_clients), dpi=dpi)
    ax = fig.add_subplot()
    image = ax.imshow(m, aspect="auto", cmap="viridis", vmin=0.0, vmax=max(float(np.nanmax(m)) if np.isfinite(m).any() else 1.0, 1e-9))
    fig.colorbar(image, ax=ax, label="mean weight")
    for i, classes in enumerate(client_classes or []):
        for c in classes:  # boxes show whether clients are trusted on the classes they hold
            ax.add_patch(Rectangle((c - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="white", linewidth=1.2))
    ax.set_xlabel("true class of public sample")
    ax.set_ylabel("client")
    ax.set_xticks(range(n_classes))
    ax.set_yticks(range(n_clients))
    ax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def png_to_array(png: bytes) -> np.ndarray:
    from matplotlib.image import imread

    return (imread(io.BytesIO(png), format="png")[..., :3] * 255).astype(np.uint8)


def wandb_round_payload(wandb: Any, metrics: dict[str, Any], client_classes: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Scalars as they are (accuracies only in rounds that evaluated); per-client lists as one
    ``wandb.Table``; the trust matrix as a heatmap ``wandb.Image``. Lists would otherwise be logged
    as opaque histograms."""
    payload = {k: v for k, v in metrics.items() if not isinstance(v, (list, tuple))}
    if metrics.get("eval/test_samples", 1) == 0:  # a round without evaluation: no accuracy points at all
        payload = {k: v for k, v in payload.items() if not k.startswith(("after_private/", "after_public/"))}
    columns, rows = client_rows(metrics, client_classes)
    if rows:
        payload["clients/accuracy"] = wandb.Table(columns=columns, data=rows)
    matrix = metrics.get(TRUST_KEY)
    if matrix:
        r = metrics.get("round")
        png = trust_heatmap_png(matrix, f"who to trust, round {r}", client_classes)
        payload[TRUST_KEY] = wandb.Image(png_to_array(png), caption=f"mean weight per client x true class, round {r}")
    return payload
