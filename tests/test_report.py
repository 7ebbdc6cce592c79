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


def fake_run(root: Path, method: str, k: int, seed: int, best: float, rounds: int = 3, finished: bool = True,
             mode: str = "fd", tau: float = 0.25, summary: dict | None = None):
    """A run directory as RunDirectory writes it, with accuracy peaking at ``best`` in round 2 (after
    the private phase: ``best`` - 0.1)."""
    path = root / f"20260101-000000-{mode}-{method}-tau{tau}-k{k}-seed{seed}"
    path.mkdir(parents=True)
    aggregator = json.loads(json.dumps(AGGREGATORS[method]))
    if method == "sUWA":
        aggregator["init_args"]["tau"] = tau
    config = {"seed": seed, "data": {"dataset": "digits", "partition": "classes", "classes_per_client": k},
              "aggregator": aggregator, "federation": {"rounds": rounds, "mode": mode}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for r in range(1, rounds + 1):
        acc = best if r == 2 else best - 0.05
        row = {"round": r, "after_public/global_acc_mean": acc, "after_public/local_acc_mean": 0.9,
               "after_private/global_acc_mean": acc - 0.1,
               "weights/chi": 0.05 if method == "AVG" else 0.3, "comm/up_bytes_total": 1000 * r,
               "comm/down_bytes_total": 2000 * r}
        if method == "sUWA":
            row["clients/trust_matrix"] = [[0.5, 0.5, None], [0.5, 0.5, None]]
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (path / "summary.json").write_text(json.dumps({"finished": finished, "rounds": rounds, **(summary or {})}))
    return path


@pytest.fixture
def runs_dir(tmp_path):
    root = tmp_path / "runs"
    for (method, k, seed), best in BEST.items():
        fake_run(root, method, k, seed, best)
    fake_run(root, "AVG", 2, 2, 0.99, finished=False)  # crashed: left out unless asked for
    return root


def cell(values, n=None):
    """A Table 1 cell as table1.md writes it: mean ± sample std (%) and n seeds; no std for one seed."""
    values = [100 * v for v in values]
    text = f"{statistics.mean(values):.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")
    return text, f"(n={len(values)})"


def md_row(md: str, label: str) -> list[str]:
    line = next(line for line in md.splitlines() if line.startswith(f"| digits | {label} |"))
    return [c.strip() for c in line.strip("|").split("|")][2:]


def test_table1_is_mean_and_std_over_seeds_after_each_phase(runs_dir):
    index = write_report(runs_dir)
    md = (index.parent / "table1.md").read_text()
    assert "| dataset | method | k=2 after private | k=2 after public | k=5 after private | k=5 after public | Ref. |" in md

    def expected(method, k, phase, bold=False):
        values = [BEST[(method, k, s)] - (0.1 if phase == "private" else 0) for s in (0, 1)]
        text, n = cell(values)
        return f"**{text}** {n}" if bold else f"{text} {n}"

    # sUWA wins at k=2, AVG at k=5, after either phase: bold is per column
    assert md_row(md, "AVG") == [expected("AVG", 2, "private"), expected("AVG", 2, "public"),
                                 expected("AVG", 5, "private", True), expected("AVG", 5, "public", True), ""]
    assert md_row(md, "sUWA τ=0.25") == [expected("sUWA", 2, "private", True), expected("sUWA", 2, "public", True),
                                         expected("sUWA", 5, "private"), expected("sUWA", 5, "public"), ""]
    page = index.read_text()
    # Fig. 2, App. B, chi vs k, chi vs round, bytes, and a trust matrix per sUWA run (2 k x 2 seeds)
    assert page.count('src="data:image/png;base64,') == 9
    assert "1 run(s) left out" in page and "-AVG-tau0.25-k2-seed2</code>: unfinished" in page
    for name in ("figure2_accuracy_vs_k.png", "appB_accuracy_curves.png", "chi_vs_k.png", "chi_vs_round.png",
                 "accuracy_vs_bytes.png", *(f"trust_matrix_{i}.png" for i in range(4))):
        assert (index.parent / "figures" / name).read_bytes()[:4] == b"\x89PNG"
    # the settings header: what all runs share, what varies, the seeds
    assert '<table id="settings">' in page and "data.dataset" in page and "seeds</th><td>0, 1 (n = 2)" in page
    assert "varies</th><td>aggregator, aggregator.init_args.tau, data.classes_per_client, seed<" in page


def test_csv_and_latex_tables_next_to_the_page(runs_dir):
    import csv

    index = write_report(runs_dir)
    rows = list(csv.DictReader((index.parent / "table1.csv").open()))
    assert len(rows) == 2 * 2 * 2  # 2 rules x 2 k x 2 phases
    avg5 = next(r for r in rows if (r["method"], r["k"], r["phase"]) == ("AVG", "5", "public"))
    assert float(avg5["mean_acc_pct"]) == pytest.approx(65.0) and float(avg5["std_acc_pct"]) == pytest.approx(7.0711, abs=1e-3)
    assert avg5["n_seeds"] == "2" and avg5["best_in_column"] == "1"
    tex = (index.parent / "table1.tex").read_text()
    assert tex.count(r"\mathbf{") == 4 and r"$\mathbf{65.00}{\scriptstyle\pm 7.07}^{n=2}$" in tex
    assert tex.count(r"\\") == 2 + 2  # two header lines, two rows
    assert r"sUWA $\tau$=0.25" in tex and tex.startswith(r"\begin{table}")
    assert tex.isascii()  # pdflatex-safe: τ and ± as math


def test_baselines_have_their_own_labels_and_never_take_the_bold(tmp_path):
    root = tmp_path / "runs"
    fake_run(root, "AVG", 2, 0, 0.30)
    fake_run(root, "AVG", 2, 1, 0.40)
    fake_run(root, "sUWA", 2, 0, 0.50)
    # the baselines score higher than every rule, and their configs still name a rule
    fake_run(root, "sUWA", 2, 0, 0.70, mode="local_only")
    fake_run(root, "AVG", 2, 0, 0.90, mode="reference")
    fake_run(root, "AVG", 2, 1, 0.80, mode="reference")
    index = write_report(root)
    md = (index.parent / "table1.md").read_text()
    assert md_row(md, "AVG") == ["25.00 ± 7.07 (n=2)", "35.00 ± 7.07 (n=2)", "85.00 ± 7.07 (n=2)"]  # Ref. once
    assert md_row(md, "sUWA τ=0.25") == ["**40.00** (n=1)", "**50.00** (n=1)", ""]
    assert md_row(md, "*Local only (no communication)*") == ["60.00 (n=1)", "70.00 (n=1)", ""]
    assert "Ref." not in [line.split("|")[2].strip() for line in md.splitlines()[4:] if line.startswith("|")]
    assert "± 0.00" not in md
    page = index.read_text()
    assert '<tr class="baseline"><th>digits</th><th>Local only (no communication)</th>' in page
    assert "1 federated distillation" not in page and "3 federated distillation, 1 local only, 2 reference" in page


def test_a_validation_selected_accuracy_is_used_only_when_every_run_has_one(tmp_path):
    root = tmp_path / "runs"
    fake_run(root, "AVG", 2, 0, 0.30, summary={"selected_global_acc_mean": 0.25})
    fake_run(root, "sUWA", 2, 0, 0.50, summary={"selected_global_acc_mean": 0.45})
    index = write_report(root)
    md = (index.parent / "table1.md").read_text()
    assert md_row(md, "AVG")[1] == "25.00 (n=1)" and md_row(md, "sUWA τ=0.25")[1] == "**45.00** (n=1)"
    assert md.startswith("Validation-selected (selected_global_acc_mean)")
    assert "<b>validation-selected</b> accuracy (<code>selected_global_acc_mean</code>" in index.read_text()
    # one run without a validation set: no table mixes the two selections, all fall back to test-best
    mixed = tmp_path / "mixed"
    fake_run(mixed, "AVG", 2, 0, 0.30, summary={"selected_global_acc_mean": 0.25})
    fake_run(mixed, "sUWA", 2, 0, 0.50)
    md = (write_report(mixed).parent / "table1.md").read_text()
    assert md_row(md, "AVG")[1] == "30.00 (n=1)" and "validation-selected" not in md.lower()


def test_trust_matrix_of_every_run_boxes_own_classes_and_tau_plot(tmp_path):
    from fdlit.report import trust_figures

    root = tmp_path / "runs"
    for tau in (0.25, 1.0):
        fake_run(root, "sUWA", 2, 0, 0.5, tau=tau, summary={"client_classes": [[0, 1], [1, 2]]})
    fake_run(root, "sUWA", 3, 1, 0.5)  # no client_classes recorded: drawn, without boxes
    runs, _ = load_runs(root)
    figures = trust_figures(runs)
    assert len(figures) == 3
    captions = [c for c, _ in figures]
    assert sum("no boxes" in c for c in captions) == 1 and any("k=3, seed 1" in c for c in captions)
    from fdlit.runs.dashboards import png_to_array, trust_heatmap_png

    boxed = png_to_array(figures[0][1])
    plain = png_to_array(trust_heatmap_png([[0.5, 0.5, None], [0.5, 0.5, None]], captions[0].split(" (")[0]))
    assert boxed.shape == plain.shape and (boxed != plain).any()  # the boxes were drawn
    index = write_report(root)
    assert (index.parent / "figures" / "accuracy_vs_tau.png").read_bytes()[:4] == b"\x89PNG"


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
    # runs of different settings are not compared either: no bold between them
    assert md_row(md, "[rounds=3] AVG") == ["10.00 (n=1)", "20.00 (n=1)", ""]
    assert md_row(md, "[rounds=5] AVG") == ["50.00 (n=1)", "60.00 (n=1)", ""]
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
    assert len(images) == 9 and all(done and w > 100 and h > 100 for done, w, h in images)
    assert rows == 2 and header == ["dataset", "method", "k=2", "k=5", "Ref.", *["after private", "after public"] * 2]
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
    n = {0: 0.90 if used == again else 0.20, 1: 0.30}
    assert md_row(md, "AVG")[1] == " ".join(cell(n.values()))
    assert "2 run(s) left out" in index.read_text()
    # asked for, the copy of seed 0 is kept too
    runs, skipped = load_runs(root, include_duplicates=True)
    assert len(runs) == 3 and [why for _, why in skipped] == ["unfinished"]
    assert main(["report", str(root), "--include_duplicates", "--out", str(tmp_path / "dup")]) == 0
    assert "(n=3)" in (tmp_path / "dup" / "table1.md").read_text()


def test_a_run_that_left_k_at_its_default_is_labelled_k2(tmp_path):
    path = fake_run(tmp_path / "runs", "AVG", 2, 0, 0.5)
    config = yaml.safe_load((path / "config.yaml").read_text())
    config["data"]["classes_per_client"] = None  # the saved config of a run that left k at its default
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (run,), _ = load_runs(tmp_path / "runs")
    assert run.k == 2


def test_privacy_runs_get_accuracy_and_attack_auc_against_epsilon(tmp_path):
    from fdlit.report import accuracy_vs_epsilon, load_runs

    root = tmp_path / "runs"
    for seed in (0, 1):
        fake_run(root, "AVG", 2, seed, 0.80)  # no DP: a dashed line
        for sigma, eps, best in ((0.3, 40.0, 0.50), (1.0, 5.0, 0.30)):
            path = fake_run(root / f"s{sigma}", "AVG", 2, seed, best)
            config = yaml.safe_load((path / "config.yaml").read_text())
            config["privacy"] = {"noise_multiplier": sigma, "encoding": "full"}
            (path / "config.yaml").write_text(yaml.safe_dump(config))
            rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
            for row in rows:
                row.update({"privacy/epsilon": eps * row["round"] / len(rows), "privacy/mia_auc": 0.55})
            (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    runs, _ = load_runs(root)
    assert sorted({r.last("privacy/epsilon") for r in runs if r.last("privacy/epsilon")}) == [5.0, 40.0]
    assert accuracy_vs_epsilon(runs)[:8] == b"\x89PNG\r\n\x1a\n"
    page = write_report(root).read_text()
    assert "privacy_accuracy_and_attack_vs_epsilon.png" in page
    plain = tmp_path / "plain"
    fake_run(plain, "AVG", 2, 0, 0.80)
    assert accuracy_vs_epsilon(load_runs(plain)[0]) is None
    assert "privacy_accuracy" not in write_report(plain).read_text()
