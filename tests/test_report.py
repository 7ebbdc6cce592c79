import json
import os
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from fdlit.cli import main
from fdlit.errors import ConfigError
from fdlit.report import load_runs, write_report

AGGREGATORS = {
    "AVG": {"class_path": "fdlit.aggregators.ProbabilityAveragingAggregator", "init_args": {}},
    "sUWA": {"class_path": "fdlit.aggregators.SmoothedUncertaintyWeightedAggregator", "init_args": {"tau": 0.25}},
}
# best accuracy per (method, k, seed): Table 1 must show their mean ± sample std, in %
BEST = {("AVG", 2, 0): 0.20, ("AVG", 2, 1): 0.30, ("sUWA", 2, 0): 0.40, ("sUWA", 2, 1): 0.50,
        ("AVG", 5, 0): 0.60, ("AVG", 5, 1): 0.70, ("sUWA", 5, 0): 0.55, ("sUWA", 5, 1): 0.65}


def fake_run(root: Path, method: str, k: int, seed: int, best: float, rounds: int = 3, finished: bool = True):
    """A run directory as RunDirectory writes it, with accuracy peaking at ``best`` in round 2."""
    path = root / f"20260101-000000-{method}-k{k}-seed{seed}"
    path.mkdir(parents=True)
    config = {"seed": seed, "data": {"dataset": "digits", "partition": "classes", "classes_per_client": k},
              "aggregator": AGGREGATORS[method], "federation": {"rounds": rounds}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for r in range(1, rounds + 1):
        acc = best if r == 2 else best - 0.05
        row = {"round": r, "after_public/global_acc_mean": acc, "after_public/local_acc_mean": 0.9,
               "weights/chi": 0.05 if method == "AVG" else 0.3, "comm/up_bytes_total": 1000 * r,
               "comm/down_bytes_total": 2000 * r}
        if method == "sUWA":
            row["clients/trust_matrix"] = [[0.5, 0.5, None], [0.5, 0.5, None]]
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (path / "summary.json").write_text(json.dumps({"finished": finished, "rounds": rounds}))
    return path


@pytest.fixture
def runs_dir(tmp_path):
    root = tmp_path / "runs"
    for (method, k, seed), best in BEST.items():
        fake_run(root, method, k, seed, best)
    fake_run(root, "AVG", 2, 2, 0.99, finished=False)  # crashed: left out unless asked for
    return root


def test_table1_is_mean_and_std_over_seeds(runs_dir):
    index = write_report(runs_dir)
    md = (index.parent / "table1.md").read_text()
    avg2 = [100 * BEST[("AVG", 2, s)] for s in (0, 1)]
    assert f"| AVG | {statistics.mean(avg2):.2f} ± {statistics.stdev(avg2):.2f} |" in md
    assert "| sUWA τ=0.25 | **45.00 ± 7.07** | 60.00 ± 7.07 |" in md  # best per column in bold
    assert "**65.00 ± 7.07**" in md  # AVG wins at k=5
    page = index.read_text()
    assert page.count('src="data:image/png;base64,') == 5  # Fig. 2, App. B, chi, bytes, 1 trust matrix
    assert "1 run(s) left out" in page and "-AVG-k2-seed2</code>: unfinished" in page
    for name in ("figure2_accuracy_vs_k.png", "appB_accuracy_curves.png", "chi_vs_round.png",
                 "accuracy_vs_bytes.png", "trust_matrix_0.png"):
        assert (index.parent / "figures" / name).read_bytes()[:4] == b"\x89PNG"


def test_unfinished_runs_join_on_request(runs_dir):
    runs, skipped = load_runs(runs_dir, include_unfinished=True)
    assert len(runs) == 9 and not skipped
    assert max(r.best() for r in runs) == pytest.approx(0.99)


def test_report_cli_and_empty_folder(tmp_path, runs_dir, capsys):
    assert main(["report", str(runs_dir), "--out", str(tmp_path / "out")]) == 0
    assert "8 run(s)" in (tmp_path / "out" / "index.html").read_text()
    assert main(["report", str(runs_dir), "--out", str(tmp_path / "all"), "--include_unfinished"]) == 0
    assert "9 run(s)" in (tmp_path / "all" / "index.html").read_text()
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "runs: no finished run directories" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="runs"):
        load_runs(tmp_path / "missing")


def test_runs_of_different_settings_are_never_pooled(tmp_path):
    root = tmp_path / "runs"
    short = fake_run(root, "AVG", 2, 0, 0.2, rounds=3)
    fake_run(root / "long", "AVG", 2, 0, 0.6, rounds=5)
    runs, _ = load_runs(root)
    assert sorted(r.method for r in runs) == ["[rounds=3] AVG", "[rounds=5] AVG"]
    md = (write_report(root).parent / "table1.md").read_text()
    assert "| [rounds=3] AVG | 20.00 ± 0.00 |" in md and "| [rounds=5] AVG | **60.00 ± 0.00** |" in md
    assert short.exists()


def chromium_path():
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def open_in_browser(browser, url):
    """(problems, images, Table 1 rows, Table 1 header) of a page as a real browser shows it."""
    problems = []
    page = browser.new_page()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url[:80]}"))
    page.goto(url, wait_until="load")
    images = page.evaluate("[...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    rows = page.evaluate("document.querySelectorAll('#table1 tbody tr').length")
    header = page.evaluate("[...document.querySelectorAll('#table1 thead th')].map(t => t.textContent)")
    page.close()
    return problems, images, rows, header


def test_report_renders_in_headless_chromium(runs_dir, tmp_path):
    """The page in a real browser: every figure decoded, the table present, no console errors."""
    executable = chromium_path()
    if executable is None and not os.environ.get("CI"):
        pytest.skip("chromium is not installed (apt-get install -y chromium); CI installs it and runs this")
    if not os.environ.get("CI"):
        pytest.importorskip("playwright", reason="pip install playwright (a dev dependency)")
    from playwright.sync_api import sync_playwright

    index = write_report(runs_dir)
    # negative control: the same page with a broken figure and a script error must be caught
    broken = index.with_name("broken.html")
    broken.write_text(index.read_text().replace(
        "</body>", '<img src="missing.png"><script>console.error("boom")</script></body>'))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            problems, images, rows, header = open_in_browser(browser, index.as_uri())
            bad_problems, bad_images, _, _ = open_in_browser(browser, broken.as_uri())
        finally:
            browser.close()
    assert problems == []
    assert len(images) == 5 and all(done and w > 100 and h > 100 for done, w, h in images)
    assert rows == 2 and header == ["method", "k=2", "k=5"]
    assert any("boom" in p for p in bad_problems) and any("missing.png" in p or "ERR_FILE" in p for p in bad_problems)
    assert bad_images[-1][1] == 0  # the broken image did not decode


def test_each_setting_and_seed_counts_once_and_the_rest_is_listed(tmp_path, capsys):
    root = tmp_path / "runs"
    kept = fake_run(root, "AVG", 2, 0, 0.20)
    again = fake_run(root / "again", "AVG", 2, 0, 0.90)  # the same setting and seed, run a second time
    partial = fake_run(root / "partial", "AVG", 2, 0, 0.95, finished=False)
    fake_run(root, "AVG", 2, 1, 0.30)
    runs, skipped = load_runs(root, include_unfinished=True)
    assert len(runs) == 2 and sorted(r.seed for r in runs) == [0, 1]
    reasons = {p: why for p, why in skipped}
    # the finished copy with the newest folder name is kept (same name here: the first in order)
    used = next(r.path for r in runs if r.seed == 0)
    assert used in (kept, again) and len(reasons) == 2 and partial in reasons
    assert all(why == f"same setting and seed as {used.name}" for why in reasons.values())
    index = write_report(root, include_unfinished=True)
    out = capsys.readouterr().out
    assert "fdlit report: 2 run(s) used, 2 left out: " in out and "partial/" in out
    md = (index.parent / "table1.md").read_text()
    n = {0: 100 * (0.90 if used == again else 0.20), 1: 30.0}
    assert f"| AVG | {statistics.mean(n.values()):.2f} ± {statistics.stdev(n.values()):.2f} |" in md
    assert "2 run(s) left out" in index.read_text()


def test_a_run_that_left_k_at_its_default_is_labelled_k2(tmp_path):
    path = fake_run(tmp_path / "runs", "AVG", 2, 0, 0.5)
    config = yaml.safe_load((path / "config.yaml").read_text())
    config["data"]["classes_per_client"] = None  # the saved config of a run that left k at its default
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (run,), _ = load_runs(tmp_path / "runs")
    assert run.k == 2
