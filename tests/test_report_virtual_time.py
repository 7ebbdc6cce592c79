"""The report's accuracy-against-virtual-time figure and the clock in a run's label."""

import json

import yaml

from fdlit.reporting import load_runs, write_report
from fdlit.reporting.labels import method_label
from tests.fake_runs import fake_run

ASYNC = {"class_path": "fdlit.federation.clock.AsynchronousClock",
         "init_args": {"buffer": 5, "staleness": {"class_path": "fdlit.federation.clock.Polynomial"}}}
DEADLINE = {"class_path": "fdlit.federation.clock.SynchronousClock", "init_args": {"deadline": 30.0}}


def on_a_clock(path, clock, seconds_per_round):
    """A fake run made as if on a virtual clock: its config names the clock, its rounds carry the time."""
    config = yaml.safe_load((path / "config.yaml").read_text())
    config["federation"]["clock"] = clock
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row["time/virtual_s"] = seconds_per_round * row["round"]
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_runs_on_a_virtual_clock_get_an_accuracy_against_time_figure(tmp_path):
    root = tmp_path / "runs"
    for seed in (0, 1):
        on_a_clock(fake_run(root, "sUWA", 2, seed, 0.5), ASYNC, 10.0)
        fake_run(root, "AVG", 2, seed, 0.4)  # no clock: not in the time figure
    index = write_report(root, formats=("png",))
    page = index.read_text()
    assert (index.parent / "figures" / "accuracy_vs_virtual_time.png").read_bytes()[:4] == b"\x89PNG"
    assert "figures/accuracy_vs_virtual_time.png" in page and "vs virtual seconds" in page
    methods = {r.method for r in load_runs(root)[0]}
    assert methods == {"AVG", "sUWA τ=0.25, async buffer 5, polynomial"}


def test_without_a_clock_there_is_no_time_figure_and_labels_are_unchanged(tmp_path):
    root = tmp_path / "runs"
    fake_run(root, "AVG", 2, 0, 0.4)
    index = write_report(root, formats=("png",))
    assert "accuracy_vs_virtual_time" not in index.read_text()
    config = {"aggregator": {"class_path": "fdlit.methods.ProbabilityAveraging"}, "federation": {"clock": None}}
    assert method_label(config) == "AVG"
    assert method_label({**config, "federation": {"clock": DEADLINE}}) == "AVG, sync deadline 30 s"


def test_each_accuracy_is_drawn_at_its_own_rounds_time_when_rounds_in_between_were_not_evaluated(tmp_path):
    from fdlit.reporting.figures import curves
    from fdlit.reporting.runs import ACC

    root = tmp_path / "runs"
    path = fake_run(root, "AVG", 2, 0, 0.4, rounds=5)
    on_a_clock(path, ASYNC, 10.0)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row["round"] in (2, 4):  # eval_every_n_rounds: no accuracy logged
            row["after_public/global_acc_mean"] = None
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    runs = load_runs(root)[0]
    fig = curves(runs, [runs[0].method], [2], [(ACC, "global accuracy (%)")], xkey="time/virtual_s")
    (line,) = fig.axes[0].lines
    assert list(line.get_xdata()) == [10.0, 30.0, 50.0]  # rounds 1, 3, 5 at their own virtual times
