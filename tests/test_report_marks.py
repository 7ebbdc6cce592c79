"""How the report marks things: own classes in a trust matrix, what varies among runs, panel titles."""

import numpy as np

from fdlit.reporting import load_runs, shared_settings
from tests.fake_runs import fake_run


def test_own_classes_are_dots_that_stay_apart_where_boxes_would_merge():
    from matplotlib.collections import PathCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    from fdlit.runs.dashboards import draw_trust_heatmap

    # k = 5 of 10: neighbouring own classes on every row, the case where outlines merged into a maze
    classes = [[0, 1, 2, 3, 4], [2, 3, 4, 5, 6], [5, 6, 7, 8, 9]]
    matrix = np.random.default_rng(0).random((3, 10)).tolist()
    fig = Figure(figsize=(3.3, 2.5))
    ax = fig.subplots()
    draw_trust_heatmap(fig, ax, matrix, classes)
    (dots,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert sorted(map(tuple, dots.get_offsets().tolist())) == sorted((c, i) for i, row in enumerate(classes)
                                                                      for c in row)
    assert not [p for p in ax.patches if isinstance(p, Rectangle)]  # no outlines to merge
    # a dot is narrower than its cell, so neighbouring dots never touch
    cell_pt = 72 * min(ax.get_position().width * 3.3 / 10, ax.get_position().height * 2.5 / 3)
    assert 0 < np.sqrt(dots.get_sizes()[0]) < 0.5 * cell_pt
    assert ax.get_xlim() == (-0.5, 9.5)  # the dots did not widen the image's extent
    bare = Figure(figsize=(3.3, 2.5))
    draw_trust_heatmap(bare, bare.subplots(), matrix)
    assert not bare.axes[0].collections  # no classes recorded: no dots


def test_a_knob_only_one_method_has_varies_only_when_its_runs_differ_in_it(tmp_path):
    same = tmp_path / "same"
    fake_run(same, "AVG", 2, 0, 0.3)
    fake_run(same, "UWA", 2, 0, 0.3)
    fake_run(same, "sUWA", 2, 0, 0.3, tau=0.5)
    fake_run(same, "sUWA", 2, 1, 0.3, tau=0.5)
    _, varying = shared_settings(load_runs(same)[0])
    assert varying == ["aggregator", "seed"]  # AVG and UWA lack τ; every sUWA run has τ = 0.5
    swept = tmp_path / "swept"
    fake_run(swept, "AVG", 2, 0, 0.3)
    fake_run(swept, "sUWA", 2, 0, 0.3, tau=0.25)
    fake_run(swept, "sUWA", 2, 0, 0.3, tau=1.0)
    _, varying = shared_settings(load_runs(swept)[0])
    assert varying == ["aggregator", "aggregator.init_args.tau"]


def test_app_b_panels_are_titled_with_their_quantity_and_k(tmp_path):
    from fdlit.reporting import ACC, LOCAL, curves
    from fdlit.reporting.paper_figures import paper_style

    root = tmp_path / "runs"
    for k in (2, 5):
        fake_run(root, "AVG", k, 0, 0.3)
    fake_run(root, "UWA", 5, 0, 0.3)  # at k = 5 only: drawn in those panels alone, still in the legend
    runs, _ = load_runs(root)
    with paper_style():
        fig = curves(runs, ["AVG", "UWA"], [2, 5], [(ACC, "global accuracy (%)"), (LOCAL, "local accuracy (%)")])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["AVG", "UWA"]
    top, bottom = fig.axes[:2], fig.axes[2:]
    assert [ax.get_title() for ax in top] == ["global accuracy, k = 2", "global accuracy, k = 5"]
    assert [ax.get_title() for ax in bottom] == ["local accuracy, k = 2", "local accuracy, k = 5"]
    assert all(ax.get_xlabel() == "round" for ax in fig.axes)
