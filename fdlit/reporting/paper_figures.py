"""Figures a paper can print: one-column (3.3 in) or two-column (6.9 in) wide, every text >= 8 pt at
that size, no figure title (captions live in the HTML and LaTeX; only the panels of a figure of
several are titled, with what tells them apart), written as vector PDF, SVG and a 300-dpi PNG.

A figure is built inside :func:`paper_style` (the font sizes) with :func:`new_figure`, and written
with :func:`save_figure`; :func:`text_sizes` lists every visible text's size (for checks).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fdlit.runs.atomic_write import write_file

ONE_COLUMN_IN = 3.3  # a column of a two-column paper (e.g. NeurIPS, ICML, IEEE)
TWO_COLUMN_IN = 6.9  # the full text width
MIN_FONT_PT = 8
PNG_DPI = 300
FORMATS = ("pdf", "svg", "png")


def check_formats(formats) -> tuple[str, ...]:
    from fdlit.errors import ConfigError

    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ConfigError("formats", f"allowed: {', '.join(FORMATS)} (png is always written); got {list(formats)}")
    return tuple(formats)

STYLE = {
    "font.size": MIN_FONT_PT, "axes.labelsize": MIN_FONT_PT, "axes.titlesize": MIN_FONT_PT,
    "xtick.labelsize": MIN_FONT_PT, "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT,
    "legend.title_fontsize": MIN_FONT_PT, "figure.titlesize": MIN_FONT_PT,
    "lines.linewidth": 1.2, "lines.markersize": 3.5, "axes.linewidth": 0.6, "grid.linewidth": 0.4,
    "pdf.fonttype": 42,  # TrueType in the PDF: text stays text (selectable, editable), not Type 3
    "svg.fonttype": "path",  # the SVG looks the same without the fonts installed
    "legend.frameon": False,
}


@contextlib.contextmanager
def paper_style() -> Iterator[None]:
    """Font sizes and line widths for print; every figure of the report is built inside it."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        yield


def new_figure(ncols: int = 1, nrows: int = 1, width: float = ONE_COLUMN_IN, panel_aspect: float = 0.75):
    """A figure ``width`` inches wide (one or two columns) with ``nrows x ncols`` panels of height
    ``panel_aspect`` times their width; the layout engine keeps the size fixed."""
    from matplotlib.figure import Figure

    height = min(9.0, max(1.8, panel_aspect * width / ncols * nrows + 0.5))
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = np.array(fig.subplots(nrows, ncols, squeeze=False))
    return fig, axes


def plain_text(text: str) -> str:
    """Text drawn as is: a ``$`` in a run's setting would start matplotlib's math mode."""
    return str(text).replace("$", r"\$")


def text_sizes(fig) -> list[tuple[str, float]]:
    """(text, size in pt) of every visible, non-empty text of the figure."""
    from matplotlib.text import Text

    fig.draw_without_rendering()
    return [(t.get_text(), t.get_fontsize()) for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def titles(fig) -> list[str]:
    """Every title drawn inside the figure (a one-panel figure has none: its caption says it)."""
    found = [fig._suptitle.get_text()] if getattr(fig, "_suptitle", None) is not None else []
    for ax in fig.axes:
        found += [ax.get_title(loc) for loc in ("left", "center", "right") if ax.get_title(loc)]
    return found


def save_figure(fig, folder: Path, stem: str, formats: tuple[str, ...] = FORMATS) -> bytes:
    """Write ``<stem>.pdf``, ``.svg`` and a 300-dpi ``.png`` (``formats``) into ``folder``; the PNG's
    bytes back (the HTML page inlines it)."""
    folder.mkdir(parents=True, exist_ok=True)
    png = b""
    fig.draw_without_rendering()  # lay the figure out once, then keep that layout for every format
    fig.set_layout_engine("none")
    for fmt in sorted(set(formats) | {"png"}, key=FORMATS.index):  # the page shows the PNG
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=PNG_DPI if fmt == "png" else None, metadata=_metadata(fmt))
        write_file(folder / f"{stem}.{fmt}", buf.getvalue())
        png = buf.getvalue() if fmt == "png" else png
    return png


def _metadata(fmt: str) -> dict:
    # no creation date: the same runs give byte-identical PDF and SVG files
    return {"pdf": {"CreationDate": None}, "svg": {"Date": None}}.get(fmt, {})


def method_colors(methods: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def legend_below(fig, ax) -> None:
    """The legend under the panels, outside the data, inside the figure: in as many columns as fit
    the figure's width (8-pt text is about 4.5 pt a character), a label too long for one column
    wrapped onto lines; the figure grows by the legend's height. Every panel's lines are named, each
    once: a method with runs at one k only is drawn in that k's panel alone."""
    import textwrap

    named: dict[str, Any] = {}
    for panel in [ax, *(a for a in fig.axes if a is not ax)]:
        for handle, label in zip(*panel.get_legend_handles_labels(), strict=True):
            named.setdefault(label, handle)
    handles, labels = list(named.values()), list(named)
    if not handles:
        return
    sample_pt, char_pt = 30, 4.5  # the line's sample and the gap; a character at 8 pt
    width_pt = fig.get_figwidth() * 72 - 12
    longest = max(len(label) for label in labels)
    ncols = max(1, min(3, len(labels), int(width_pt // (char_pt * longest + sample_pt))))
    fits = max(8, int((width_pt / ncols - sample_pt) // char_pt))
    labels = ["\n".join(textwrap.wrap(plain_text(label), fits)) or " " for label in labels]
    lines = [label.count("\n") + 1 for label in labels]
    rows = sum(max(lines[i:i + ncols]) for i in range(0, len(lines), ncols))
    fig.set_figheight(fig.get_figheight() + 0.15 * rows + 0.05)
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols)
