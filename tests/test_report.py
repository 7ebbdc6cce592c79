import json
import os
import re
import shutil
import statistics

import pytest
import yaml

from fdlit.cli import main
from fdlit.errors import ConfigError
from fdlit.reporting import load_runs, write_report
from tests.fake_runs import fake_run, md_cells

ACC_KEY, PRIVATE_KEY = "after_public/global_acc_mean", "after_private/global_acc_mean"
PNG = ("png",)  # figure files for tests that look at the tables: PNG only, fast
# best accuracy per (method, k, seed): Table 1 must show their mean ± sample std, in %
BEST = {("AVG", 2, 0): 0.20, ("AVG", 2, 1): 0.30, ("sUWA", 2, 0): 0.40, ("sUWA", 2, 1): 0.50,
        ("AVG", 5, 0): 0.60, ("AVG", 5, 1): 0.70, ("sUWA", 5, 0): 0.55, ("sUWA", 5, 1): 0.65}


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
    """A Table 1 row's numbers (and Ref.), without its last cell, the rule that selected them."""
    return md_cells(md, label)[:-1]


def test_table1_is_mean_and_std_over_seeds_after_each_phase(runs_dir):
    index = write_report(runs_dir, formats=PNG)
    md = (index.parent / "table1.md").read_text()
    # one dataset (named in the caption) and no reference runs: no dataset column, no empty Ref. column
    assert ("| method | k=2 after private | k=2 after public | k=2 personalized | k=5 after private | k=5 after public "
            "| k=5 personalized | selected by |\n") in md
    assert md.startswith("Best mean global test accuracy (%) on digits")

    def expected(method, k, phase):
        shift = {"private": -0.1, "public": 0, "personalized": 0.25}[phase]  # personalized: local accuracy
        values = [BEST[(method, k, s)] + shift for s in (0, 1)]
        text, n = cell(values)
        return f"{text}†"  # two seeds: too few to test, so both rules are tied for best; every n is 2: said once

    phases = ("private", "public", "personalized")
    assert md_row(md, "AVG") == [expected("AVG", k, phase) for k in (2, 5) for phase in phases]
    assert md_row(md, "sUWA τ=0.25") == [expected("sUWA", k, phase) for k in (2, 5) for phase in phases]
    assert "Personalized: the mean over clients of each client's test accuracy on its own classes" in md
    assert "**" not in md and "<u>" not in md and "(n=" not in md
    assert "(n = 2 seeds per cell;" in md and "is marked † (tied for best)" in md  # the caption says n and † once
    page = index.read_text()
    # Fig. 2, App. B, chi vs k, chi vs round, bytes, and a trust matrix per sUWA run (2 k x 2 seeds)
    assert page.count('src="data:image/png;base64,') == 9
    assert "1 run(s) left out" in page and "-AVG-tau0.25-k2-seed2</code>: unfinished" in page
    trust = [f"trust_{r.path.name}" for r in load_runs(runs_dir)[0] if r.method.startswith("sUWA")]
    for stem in ("figure2_accuracy_vs_k", "appB_accuracy_curves", "chi_vs_k", "chi_vs_round", "accuracy_vs_bytes",
                 *trust):
        assert (index.parent / "figures" / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
        assert f"figures/{stem}.png" in page
    # the settings header: what all runs share, what varies, the seeds
    assert '<table id="settings">' in page and "data.dataset" in page and "seeds</th><td>0, 1 (n = 2)" in page
    # τ is sUWA's alone and the same in all its runs: AVG lacking it does not make it vary
    assert "varies</th><td>aggregator, data.classes_per_client, seed<" in page
    assert "<h2>Table 1: best test accuracy (%): the round with the best test accuracy</h2>" in page


def test_csv_and_latex_tables_next_to_the_page(runs_dir):
    import csv

    index = write_report(runs_dir, formats=PNG)
    rows = list(csv.DictReader((index.parent / "table1.csv").open()))
    assert len(rows) == 2 * 2 * 3  # 2 rules x 2 k x (2 phases + personalized)
    avg5 = next(r for r in rows if (r["method"], r["k"], r["phase"]) == ("AVG", "5", "public"))
    assert float(avg5["mean_acc_pct"]) == pytest.approx(65.0) and float(avg5["std_acc_pct"]) == pytest.approx(7.0711, abs=1e-3)
    assert avg5["n_seeds"] == "2" and avg5["best_in_column"] == "0" and avg5["tied_for_best"] == "1"
    tex = (index.parent / "table1.tex").read_text()
    assert tex.count(r"\underline{") == 12 and r"$\underline{65.00 \pm 7.07}$" in tex and r"\mathbf" not in tex
    assert "n = 2 seeds per cell" in tex and "n{=}" not in tex  # one n for every cell: said once, in the caption
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex and r"\cmidrule(lr){2-4}" in tex
    assert "Ref." not in tex.split(r"\toprule")[1]  # no reference runs: no Ref. column
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
    index = write_report(root, formats=PNG)
    md = (index.parent / "table1.md").read_text()
    # too few seeds to tell the rules apart: both tied for best; the Ref. value once, on the block's first row
    # the cells' n differ (2 and 1): each cell says its own
    assert md_row(md, "AVG") == ["25.00 ± 7.07† (n=2)", "35.00 ± 7.07† (n=2)", "60.00 ± 7.07† (n=2)", "85.00 ± 7.07 (n=2)"]
    assert md_row(md, "sUWA τ=0.25") == ["40.00† (n=1)", "50.00† (n=1)", "75.00† (n=1)", ""]
    assert md_row(md, "*Local only (no communication)*") == ["60.00 (n=1)", "70.00 (n=1)", "95.00 (n=1)", ""]
    assert "Ref." not in [line.split("|")[1].strip() for line in md.splitlines()[4:] if line.startswith("|")]
    assert "± 0.00" not in md
    page = index.read_text()
    assert '<tr class="baseline"><th>Local only (no communication)</th>' in page
    assert "1 federated distillation" not in page and "3 federated distillation, 1 local only, 2 reference" in page


def test_each_run_is_selected_by_its_own_rule_and_each_row_says_which(tmp_path):
    root = tmp_path / "runs"
    fake_run(root, "AVG", 2, 0, 0.30, summary={"selected_global_acc_mean": 0.25})
    fake_run(root, "sUWA", 2, 0, 0.50, summary={"selected_global_acc_mean": 0.45})
    index = write_report(root, formats=PNG)
    md = (index.parent / "table1.md").read_text()
    assert md_row(md, "AVG")[1] == "25.00†" and md_row(md, "sUWA τ=0.25")[1] == "45.00†"
    assert md_cells(md, "AVG")[-1] == md_cells(md, "sUWA τ=0.25")[-1] == "validation"
    assert md.startswith("Validation-selected (selected_global_acc_mean)")
    page = index.read_text()
    assert "<b>validation-selected</b> accuracy (<code>selected_global_acc_mean</code>" in page
    assert "<h2>Table 1: validation-selected test accuracy (%): the round with the best validation accuracy</h2>" \
        in page and "best test accuracy" not in page
    assert "Figure 2: validation-selected test accuracy vs classes per client k" in page
    # beside a run without a validation set: each row keeps its own rule and says which
    mixed = tmp_path / "mixed"
    fake_run(mixed, "AVG", 2, 0, 0.30, summary={"selected_global_acc_mean": 0.25})
    fake_run(mixed, "sUWA", 2, 0, 0.50)
    index = write_report(mixed, formats=PNG)
    md = (index.parent / "table1.md").read_text()
    # (and no marks: a validation-selected number is never ranked against a test-best one)
    assert md_cells(md, "AVG")[1:] == ["25.00", "55.00", "validation"]
    assert md_cells(md, "sUWA τ=0.25")[1:] == ["50.00", "75.00", "test"]
    assert md.startswith("Validation-selected or best (per row)")
    page = index.read_text()
    assert "<td class=\"selection\">validation</td>" in page and "<td class=\"selection\">test</td>" in page
    csv_rows = (index.parent / "table1.csv").read_text().splitlines()
    assert csv_rows[0].endswith(",selected_by") and all(r.endswith((",validation", ",test")) for r in csv_rows[1:])


def test_trust_matrix_of_every_run_boxes_own_classes_and_tau_plot(tmp_path):
    from fdlit.reporting import trust_figures

    root = tmp_path / "runs"
    for tau in (0.25, 1.0):
        fake_run(root, "sUWA", 2, 0, 0.5, tau=tau, summary={"client_classes": [[0, 1], [1, 2]]})
    fake_run(root, "sUWA", 3, 1, 0.5)  # no client_classes recorded: drawn, without dots
    runs, _ = load_runs(root)
    figures = trust_figures(runs)
    assert len(figures) == 3
    captions = [c for _, c, _ in figures]
    assert sum("no dots" in c for c in captions) == 1 and any("k=3, seed 1" in c for c in captions)
    # each file is named by its run
    assert sorted(stem for stem, _, _ in figures) == sorted(f"trust_{r.path.name}" for r in runs)
    import io

    from matplotlib.figure import Figure

    from fdlit.runs.dashboards import draw_trust_heatmap, png_to_array

    def pixels(fig):
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return png_to_array(buf.getvalue())

    boxed = pixels(figures[0][2])
    plain_fig = Figure(figsize=figures[0][2].get_size_inches(), layout="constrained")
    draw_trust_heatmap(plain_fig, plain_fig.subplots(), [[0.5, 0.5, None], [0.5, 0.5, None]])
    plain = pixels(plain_fig)
    assert boxed.shape == plain.shape and (boxed != plain).any()  # the dots were drawn
    index = write_report(root, formats=PNG)
    assert (index.parent / "figures" / "accuracy_vs_tau.png").read_bytes()[:4] == b"\x89PNG"


def test_unfinished_runs_join_on_request(runs_dir):
    runs, skipped = load_runs(runs_dir, include_unfinished=True)
    assert len(runs) == 9 and not skipped
    assert max(r.best() for r in runs) == pytest.approx(0.99)


def test_report_cli_and_empty_folder(tmp_path, runs_dir, capsys):
    assert main(["report", str(runs_dir), "--out", str(tmp_path / "out"), "--formats", "[png]"]) == 0
    assert "8 run(s)" in (tmp_path / "out" / "index.html").read_text()
    assert main(["report", str(runs_dir), "--out", str(tmp_path / "all"), "--include_unfinished", "--formats", "[png]"]) == 0
    assert "9 run(s)" in (tmp_path / "all" / "index.html").read_text()
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "runs: no finished run directories" in capsys.readouterr().err
    assert main(["report", str(runs_dir), "--formats", "[png, eps]"]) == 2
    assert "formats: allowed: pdf, svg, png" in capsys.readouterr().err
    # one format, or a comma-separated string, as well as the list form
    assert main(["report", str(runs_dir), "--out", str(tmp_path / "one"), "--formats", "png"]) == 0
    assert main(["report", str(runs_dir), "--out", str(tmp_path / "two"), "--formats", "svg,png"]) == 0
    assert not list((tmp_path / "one").rglob("*.svg")) and list((tmp_path / "two").rglob("*.svg"))
    assert main(["report", str(runs_dir), "--formats", "eps"]) == 2
    assert "formats: allowed: pdf, svg, png" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="runs"):
        load_runs(tmp_path / "missing")


def test_runs_of_different_settings_are_never_pooled(tmp_path):
    root = tmp_path / "runs"
    short = fake_run(root, "AVG", 2, 0, 0.2, rounds=3)
    fake_run(root / "long", "AVG", 2, 0, 0.6, rounds=5)
    runs, _ = load_runs(root)
    assert sorted(r.method for r in runs) == ["[rounds=3] AVG", "[rounds=5] AVG"]
    md = (write_report(root, formats=PNG).parent / "table1.md").read_text()
    # runs of different settings are not compared either: no bold between them
    assert md_row(md, "[rounds=3] AVG") == ["10.00", "20.00", "45.00"]
    assert md_row(md, "[rounds=5] AVG") == ["50.00", "60.00", "85.00"]
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

    index = write_report(runs_dir, formats=PNG)
    # negative control: the same page with an image from a file and a script must be caught
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
    assert rows == 2 and header == ["method", "k=2", "k=5", "selected by",
                                    *["after private", "after public", "personalized"] * 2]
    # the harness sees problems: the policy refuses the injected script and the file image, and says so
    assert sum("Content Security Policy" in p for p in bad_problems) >= 2 and not any("boom" in p for p in bad_problems)
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
    index = write_report(root, include_unfinished=True, formats=PNG)
    out = capsys.readouterr().out
    assert "fdlit report: 2 run(s) used, 2 left out: " in out and "partial/" in out
    md = (index.parent / "table1.md").read_text()
    n = {0: 0.90 if used == again else 0.20, 1: 0.30}
    assert md_row(md, "AVG")[1] == cell(n.values())[0]
    assert "2 run(s) left out" in index.read_text()
    # asked for, the copy of seed 0 is kept too
    runs, skipped = load_runs(root, include_duplicates=True)
    assert len(runs) == 3 and [why for _, why in skipped] == ["unfinished"]
    assert main(["report", str(root), "--include_duplicates", "--out", str(tmp_path / "dup"), "--formats", "[png]"]) == 0
    assert "(n = 3 seeds per cell;" in (tmp_path / "dup" / "table1.md").read_text()


def test_a_run_that_left_k_at_its_default_is_labelled_k2(tmp_path):
    path = fake_run(tmp_path / "runs", "AVG", 2, 0, 0.5)
    config = yaml.safe_load((path / "config.yaml").read_text())
    config["data"]["classes_per_client"] = None  # the saved config of a run that left k at its default
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (run,), _ = load_runs(tmp_path / "runs")
    assert run.k == 2


def test_the_label_attacks_uniform_guess_is_drawn_per_k(tmp_path):
    """The uniform guess's error depends on k (0.8 at k = 2 of 10 classes, near 0 at k = 10): one
    dotted line per k, never their mean, which would be no run's chance."""
    from fdlit.reporting import load_runs, upload_attacks_vs_epsilon

    root = tmp_path / "runs"
    for k, chance in ((2, 0.8), (10, 0.04)):
        path = fake_run(root / f"k{k}", "AVG", k, 0, 0.5)
        config = yaml.safe_load((path / "config.yaml").read_text())
        config["privacy"] = {"noise_multiplier": 0.1, "encoding": "full"}
        (path / "config.yaml").write_text(yaml.safe_dump(config))
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            row.update({"privacy/epsilon": 10.0, "privacy/label_tv": chance / 2, "privacy/label_tv_chance": chance,
                        "privacy/upload_mia_auc": 0.5})
        (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    figure = upload_attacks_vs_epsilon(load_runs(root)[0])
    dotted = {line.get_label(): line.get_ydata()[0] for line in figure.axes[0].lines if line.get_linestyle() == ":"}
    assert dotted == {"uniform guess, k=2": pytest.approx(0.8), "uniform guess, k=10": pytest.approx(0.04)}


def test_noise_on_the_sum_and_noise_on_each_client_are_lines_of_their_own(tmp_path):
    """The local and the central threat model at the same sigma spend the same epsilon for different
    accuracy: pooled into one line, the figure would show their mean, which no run reached."""
    from fdlit.reporting import accuracy_vs_epsilon, load_runs

    root = tmp_path / "runs"
    for accounting, best in (("local", 0.25), ("central", 0.75)):
        path = fake_run(root / accounting, "AVG", 2, 0, best)
        config = yaml.safe_load((path / "config.yaml").read_text())
        config["privacy"] = {"noise_multiplier": 0.1, "encoding": "full", "accounting": accounting}
        (path / "config.yaml").write_text(yaml.safe_dump(config))
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            row.update({"privacy/epsilon": 100.0, "privacy/mia_auc": 0.5})
        (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    figure = accuracy_vs_epsilon(load_runs(root)[0])
    lines = {c.get_label(): c.lines[0].get_ydata()[0] for c in figure.axes[0].containers}
    assert lines == {"AVG k=2": pytest.approx(25.0), "AVG, noise on the sum k=2": pytest.approx(75.0)}


def test_privacy_runs_get_accuracy_and_attack_auc_against_epsilon(tmp_path):
    from fdlit.reporting import accuracy_vs_epsilon, load_runs, upload_attacks_vs_epsilon

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
                row.update({"privacy/epsilon": eps * row["round"] / len(rows), "privacy/mia_auc": 0.55,
                            "privacy/label_tv": 0.2 + sigma / 2, "privacy/label_tv_chance": 0.8,
                            "privacy/upload_mia_auc": 0.52})
            (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    runs, _ = load_runs(root)
    assert sorted({r.last("privacy/epsilon") for r in runs if r.last("privacy/epsilon")}) == [5.0, 40.0]
    figure = accuracy_vs_epsilon(runs)
    assert len(figure.axes[0].lines) > 0 and len(figure.axes[1].lines) > 0  # accuracy and attack AUC panels
    attacks = upload_attacks_vs_epsilon(runs)  # the label attack's error grows with the noise: 0.35 and 0.70
    (data_line, *_), = [c.lines for c in attacks.axes[0].containers]  # the errorbar's line, by growing epsilon
    assert list(data_line.get_ydata()) == pytest.approx([0.7, 0.35])
    assert [line.get_ydata()[0] for line in attacks.axes[0].lines if line.get_linestyle() == ":"] == pytest.approx([0.8])
    page = write_report(root, formats=PNG).read_text()
    assert "privacy_accuracy_and_attack_vs_epsilon.png" in page and "privacy_upload_attacks_vs_epsilon.png" in page
    plain = tmp_path / "plain"
    fake_run(plain, "AVG", 2, 0, 0.80)
    assert accuracy_vs_epsilon(load_runs(plain)[0]) is None
    assert "privacy_accuracy" not in write_report(plain, formats=PNG).read_text()
    # the privacy table: a row per group (no DP, sigma 0.3, sigma 1.0), the last round's epsilon, the label
    # attack's error averaged over rounds beside the uniform guess's, the membership AUC from predictions
    table = (root / "report" / "privacy.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines()
            if line.startswith("| [") and line.split(" | ")[0].endswith("] AVG")}
    assert len(rows) == 3
    by_eps = {row[3].split(" ")[0]: row for row in rows.values()}
    assert set(by_eps) == {"–", "40.00", "5.00"}  # the run without DP has no epsilon
    assert by_eps["5.00"][2] == "30.00 ± 0.00" and by_eps["5.00"][4] == "0.700 ± 0.000"  # 0.2 + 1.0 / 2
    assert by_eps["40.00"][4] == "0.350 ± 0.000" and by_eps["40.00"][5].startswith("0.800")
    assert by_eps["40.00"][6].startswith("0.520")
    assert by_eps["–"][2] == "80.00 ± 0.00" and by_eps["–"][4] == "–"
    csv_lines = (root / "report" / "privacy.csv").read_text().splitlines()
    assert csv_lines[0] == "method,k,column,mean,std,n" and any(",ε,5.0,0.0,2" in line for line in csv_lines)
    assert 'id="privacy"' in (root / "report" / "index.html").read_text()
    assert not (plain / "report" / "privacy.md").exists()  # no privacy measured: no table


def welch_p(a, b):
    """Welch's two-sided p-value from its formula (Welch 1947), independent of the report's scipy call."""
    from scipy.stats import t as student_t

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.mean(a) - statistics.mean(b)) / (va + vb) ** 0.5
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return 2 * student_t.sf(abs(t), df)


def test_bold_only_when_welch_t_test_separates_the_best_from_the_second(tmp_path):
    from fdlit.reporting import Stat, beats

    root = tmp_path / "runs"
    seeds = {  # k=2: sUWA clearly best; k=5: AVG and sUWA overlap, UWA clearly worse
        ("AVG", 2): (0.20, 0.21, 0.22), ("sUWA", 2): (0.50, 0.51, 0.52), ("UWA", 2): (0.30, 0.31, 0.32),
        ("AVG", 5): (0.40, 0.60, 0.50), ("sUWA", 5): (0.45, 0.55, 0.65), ("UWA", 5): (0.10, 0.11, 0.12),
    }
    for (method, k), values in seeds.items():
        for seed, best in enumerate(values):
            fake_run(root, method, k, seed, best)
    md = (write_report(root, formats=PNG).parent / "table1.md").read_text()
    public = {m: md_row(md, m if m != "sUWA" else "sUWA τ=0.25")[1::3] for m in ("AVG", "UWA", "sUWA")}
    assert public["sUWA"][0].startswith("**") and not public["UWA"][0].startswith("**")
    assert not public["UWA"][0].endswith("†")
    assert public["AVG"][1].endswith("†") and public["sUWA"][1].endswith("†")  # tied: both marked
    assert not public["UWA"][1].startswith("**") and not public["UWA"][1].endswith("†")  # shown worse: not tied
    assert md.count("**") == 2 * 3  # one bold cell per column at k=2 (two phases, personalized), none at k=5

    # the threshold is p < 0.05, two-sided, from n = 3 seeds on
    base = [10.0, 11.0, 13.0]
    for shift in (2.0, 2.5, 3.0, 3.5, 4.0, 5.0):
        shifted = [v + shift for v in base]
        assert beats(Stat.of([v / 100 for v in shifted]), Stat.of([v / 100 for v in base])) == (
            welch_p(shifted, base) < 0.05), shift
    assert {welch_p([v + s for v in base], base) < 0.05 for s in (2.0, 5.0)} == {True, False}  # both sides seen
    two = [v / 100 for v in base[:2]]
    assert not beats(Stat.of([v + 0.5 for v in two]), Stat.of(two))  # n = 2: never bold, however far apart


def test_figures_are_paper_sized_with_readable_text_and_only_panels_titled(runs_dir):
    import re

    from fdlit.reporting import ACC, LOCAL, chi_vs_k, curves, figure2, table1, trust_figures
    from fdlit.reporting.paper_figures import ONE_COLUMN_IN, TWO_COLUMN_IN, paper_style, text_sizes, titles

    runs, _ = load_runs(runs_dir)
    table = table1(runs)
    with paper_style():
        figures = {"figure2": figure2(table), "chi_vs_k": chi_vs_k(runs, table),
                   "curves": curves(runs, ["AVG", "sUWA τ=0.25"], [2, 5], [(ACC, "global"), (LOCAL, "local")]),
                   **{stem: fig for stem, _, fig in trust_figures(runs)}}
    assert len(figures) == 3 + 4
    for name, fig in figures.items():
        assert fig.get_figwidth() in (ONE_COLUMN_IN, TWO_COLUMN_IN), name
        sizes = text_sizes(fig)
        assert sizes and min(size for _, size in sizes) >= 8, (name, sorted(sizes, key=lambda s: s[1])[:3])
        if name != "curves":
            assert titles(fig) == [], name
    # a figure of several panels titles each: its quantity and its k
    assert sorted(titles(figures["curves"])) == ["global, k = 2", "global, k = 5", "local, k = 2", "local, k = 5"]
    assert {ax.get_xlabel() for ax in figures["curves"].axes if ax.get_xlabel()} == {"round"}
    assert figures["figure2"].get_figwidth() == ONE_COLUMN_IN and figures["curves"].get_figwidth() == TWO_COLUMN_IN
    # the files: the PDF page is the figure's size (72 pt per inch), the PNG 300 dpi
    index = write_report(runs_dir, formats=("pdf", "png"))
    pdf = (index.parent / "figures" / "figure2_accuracy_vs_k.pdf").read_bytes()
    width = float(re.search(rb"/MediaBox \[ *0 +0 +([0-9.]+)", pdf).group(1))
    assert width == pytest.approx(72 * ONE_COLUMN_IN)
    from PIL import Image

    with Image.open(index.parent / "figures" / "appB_accuracy_curves.png") as png:
        assert png.size[0] == round(300 * TWO_COLUMN_IN) and png.info["dpi"][0] == pytest.approx(300, abs=0.01)
    # a negative control: the checks see a title and small text
    from matplotlib.figure import Figure

    bad = Figure(figsize=(4, 3))
    ax = bad.subplots()
    ax.set_title("a title", fontsize=6)
    assert titles(bad) == ["a title"] and min(size for _, size in text_sizes(bad)) == 6


HOSTILE = "<script>alert(1)</script>"


def hostile(node):
    """Every leaf of a config or summary replaced by a hostile string, and a hostile key added."""
    if isinstance(node, dict):
        return {**{k: hostile(v) for k, v in node.items()}, HOSTILE: HOSTILE}
    if isinstance(node, list):
        return [hostile(v) for v in node]
    return HOSTILE


def test_every_value_from_a_run_is_escaped_and_scripts_are_forbidden(tmp_path):
    root = tmp_path / "runs"
    for seed in (0, 1):
        fake_run(root, "AVG", 2, seed, 0.3)
        fake_run(root, "sUWA", 2, seed, 0.5, summary={"client_classes": [[0, 1], [1, 2]]})
    # one run with a hostile value in every field of its config and summary, in a hostile folder name
    path = fake_run(root, "sUWA", 2, 2, 0.4, summary={"client_classes": [[0, 1], [1, 2]], "best_global_acc_mean": 0.4})
    config = hostile(yaml.safe_load((path / "config.yaml").read_text()))
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    summary = hostile(json.loads((path / "summary.json").read_text()))
    summary["finished"] = True  # used in the report (an unfinished one would only be listed)
    (path / "summary.json").write_text(json.dumps(summary))
    path.rename(path.with_name(path.name + "-<img src=x onerror=alert(2)>"))
    index = write_report(root)
    page = index.read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(2)&gt;" in page
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page).group(1)
    assert "default-src 'none'" in csp and "script-src 'none'" in csp and "img-src data:" in csp
    assert "unsafe-inline" not in csp  # the page's one stylesheet is allowed by its hash
    for name in ("table1.md", "table1.csv", "table1.tex"):
        assert (index.parent / name).read_text()  # written despite the hostile values
    tex = (index.parent / "table1.tex").read_text()
    assert tex.isascii() and "<script>" not in tex
    # every figure in every format, the hostile run's trust matrix too, named by its (folder-safe) run name
    pngs = sorted((index.parent / "figures").glob("*.png"))
    # the hostile run's dataset is a section of its own: digits has Fig. 2, App. B, χ x2, bytes and 2 trust
    # matrices; the hostile section (no numeric k) App. B, χ vs round, bytes and its trust matrix
    assert len(pngs) == page.count('src="data:image/png;base64,') == 7 + 4
    for png in pngs:
        assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-" and f"figures/{png.stem}.pdf" in page
        assert b"<svg" in png.with_suffix(".svg").read_bytes()[:1000]
    assert sum("_trust_" in p.name for p in pngs) == 3 and all("<" not in p.name for p in pngs)


def test_report_with_hostile_values_runs_no_script_in_headless_chromium(tmp_path):
    """The page in a real browser: the policy blocks an injected script (negative control), and the
    page itself needs nothing the policy forbids."""
    executable = chromium_path()
    if executable is None and not os.environ.get("CI"):
        pytest.skip("chromium is not installed (apt-get install -y chromium); CI installs it and runs this")
    if not os.environ.get("CI"):
        pytest.importorskip("playwright", reason="pip install playwright (a dev dependency)")
    from playwright.sync_api import sync_playwright

    root = tmp_path / "runs"
    fake_run(root, "AVG", 2, 0, 0.3)
    path = fake_run(root, "sUWA", 2, 0, 0.5)
    (path / "config.yaml").write_text(yaml.safe_dump(hostile(yaml.safe_load((path / "config.yaml").read_text()))))
    index = write_report(root, formats=PNG)
    injected = index.with_name("injected.html")
    injected.write_text(index.read_text().replace("</body>", f"{HOSTILE}</body>"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        try:
            seen = {}
            for page_file in (index, injected):
                dialogs, console = [], []
                page = browser.new_page()
                page.on("dialog", lambda d, dialogs=dialogs: (dialogs.append(d.message), d.dismiss()))
                page.on("console", lambda m, console=console: console.append(m.text))
                page.goto(page_file.as_uri(), wait_until="load")
                page.wait_for_timeout(200)
                seen[page_file.name] = (dialogs, console,
                                        page.evaluate("getComputedStyle(document.body).fontFamily"))
                page.close()
        finally:
            browser.close()
    dialogs, console, font = seen["index.html"]
    assert dialogs == [] and console == [] and "system-ui" in font  # the stylesheet applies under the policy
    dialogs, console, _ = seen["injected.html"]
    assert dialogs == [] and any("Content Security Policy" in c for c in console)


def test_a_trust_matrix_of_many_classes_keeps_its_labels_readable(tmp_path):
    from fdlit.reporting import trust_figures
    from fdlit.reporting.paper_figures import ONE_COLUMN_IN, paper_style, text_sizes

    path = fake_run(tmp_path / "runs", "sUWA", 2, 0, 0.5, summary={"client_classes": [[c, c + 1] for c in range(30)]})
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["clients/trust_matrix"] = [[1 / 30] * 100 for _ in range(30)]  # 30 clients x 100 classes
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with paper_style():
        ((_, _, fig),) = trust_figures(load_runs(tmp_path / "runs")[0])
    ax = fig.axes[0]
    assert fig.get_figwidth() == ONE_COLUMN_IN and min(size for _, size in text_sizes(fig)) >= 8
    assert len(ax.get_xticks()) <= 10 and len(ax.get_yticks()) <= 20  # every n-th class and client labelled
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["0", "2"]  # the labels still match their rows


def test_runs_saved_before_a_no_op_section_existed_pool_with_newer_ones():
    """A run whose config predates the adversaries section (or has the privacy section at its
    defaults) is the same setting as one with the section but no attack: one row, not two."""
    from fdlit.configuration.schema import parse_fit
    from fdlit.reporting.labels import setting_key

    parser, cfg = parse_fit(["--config", "digits.yaml"])
    now = yaml.safe_load(parser.dump(cfg, skip_unset=False))
    old = {k: v for k, v in now.items() if k not in ("adversaries", "privacy")}
    assert setting_key(old) == setting_key(now)
    attacked = {**now, "adversaries": {**now["adversaries"], "attack": "fdlit.adversaries.FreeRider", "count": 2}}
    assert setting_key(attacked) != setting_key(now)


# ---------------------------------------------------------------------------------- what a table file may hold
INJECTED = {"dataset": "<img src=x onerror=alert(1)>|x", "class_path": "evil.=HYPERLINK(1)|<script>alert(2)</script>",
            "k": "@SUM(1)\n\n\\input{/etc/passwd}"}


def injected_runs(root):
    """Two rules of a dataset named to break each table format, with a k and a class path to match."""
    for seed in (0, 1):
        fake_run(root, "AVG", 2, seed, 0.3)
        path = fake_run(root, "sUWA", 2, seed, 0.5)
        for run in (path, path.with_name(path.name.replace("sUWA", "AVG"))):
            config = yaml.safe_load((run / "config.yaml").read_text())
            config["data"]["dataset"] = INJECTED["dataset"]
            config["data"]["classes_per_client"] = INJECTED["k"]
            if run == path:
                config["aggregator"]["class_path"] = INJECTED["class_path"]
            (run / "config.yaml").write_text(yaml.safe_dump(config))


def test_table_cells_are_escaped_for_markdown_csv_and_latex(tmp_path):
    import csv

    injected_runs(tmp_path / "runs")
    index = write_report(tmp_path / "runs", formats=PNG)
    md = (index.parent / "table1.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("|")]
    cells = [len(re.findall(r"(?<!\\)\|", line)) for line in rows]
    assert len(set(cells)) == 1, rows  # an escaped | never ends a cell: every row has the header's cells
    assert "<img" not in md and "<script" not in md.lower() and "&lt;img src=x onerror=alert(1)>\\|x" in md
    assert "=HYPERLINK(1)\\|&lt;script>alert(2)&lt;/script>" in md and "†" in md  # the table's own mark stays
    table = list(csv.reader((index.parent / "table1.csv").open()))
    assert all(not cell.startswith(("=", "+", "-", "@", "\t", "\r")) for row in table for cell in row), table
    assert {row[1] for row in table[1:]} >= {"'=HYPERLINK(1)|<script>alert(2)</script>"}
    assert {row[3] for row in table[1:]} == {"'@SUM(1) \\input{/etc/passwd}"}  # line breaks: one space
    tex = (index.parent / "table1.tex").read_text()
    assert "\\input" not in tex and "\\textbackslash{}input\\{/etc/passwd\\}" in tex and "\n\n" not in tex
    body = tex.split("\\midrule")[1].split("\\bottomrule")[0].strip().splitlines()
    assert len(body) == 2 and all(line.count(" & ") == body[0].count(" & ") for line in body), body


def test_a_nested_html_or_text_value_where_a_number_belongs_is_a_missing_value(tmp_path, capsys):
    root = tmp_path / "runs"
    fake_run(root, "AVG", 2, 0, 0.3)
    path = fake_run(root, "sUWA", 2, 0, 0.5)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for row, bad in zip(rows, ({"nested": [1]}, "<b>0.9</b>", "0.95"), strict=True):
        row.update({"round": bad if bad == "0.95" else row["round"], ACC_KEY: bad, PRIVATE_KEY: [bad],
                    "weights/chi": bad, "comm/up_bytes_total": bad, "after_public/local_acc_mean": {"x": bad}})
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (path / "summary.json").write_text(json.dumps({"finished": True, "best_global_acc_mean": {"x": 1}}))
    assert main(["report", str(root), "--formats", "[png]"]) == 0
    assert capsys.readouterr().err == ""
    md = (root / "report" / "table1.md").read_text()
    assert md_row(md, "sUWA τ=0.25") == ["–", "–", "–"] and md_row(md, "AVG") == ["20.00", "30.00", "55.00"]
    assert "<b>0.9" not in (root / "report" / "index.html").read_text()


def test_a_report_that_fails_leaves_no_table_without_its_page(runs_dir, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("a figure that cannot be drawn")

    monkeypatch.setattr("fdlit.reporting.write.accuracy_vs_tau", fails)
    with pytest.raises(RuntimeError):
        write_report(runs_dir, formats=PNG)
    assert not list((runs_dir / "report").glob("table1.*")) and not (runs_dir / "report" / "index.html").exists()


def test_the_report_is_never_written_into_a_run_directory(runs_dir, capsys):
    run = next(p for p in runs_dir.iterdir() if (p / "metrics.jsonl").exists())
    before = sorted(p.name for p in run.iterdir())
    assert main(["report", str(runs_dir), "--out", str(run), "--formats", "[png]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: out: '{run}' is a run directory"), err
    assert sorted(p.name for p in run.iterdir()) == before


def test_table1_says_which_network_each_row_measures(tmp_path):
    root = tmp_path / "runs"
    for seed in (0, 1):
        fake_run(root, "AVG", 2, seed, 0.5, summary={"measured_network": "each client's own network"})
        fake_run(root, "sUWA", 2, seed, 0.6, summary={"measured_network": "the private <network>"})
    page = write_report(root, formats=PNG).read_text()
    md = (root / "report" / "table1.md").read_text()
    assert "Network measured: AVG: each client's own network; sUWA τ=0.25: the private &lt;network>." in md
    assert "<li>AVG: each client&#x27;s own network</li>" in page and "the private &lt;network&gt;" in page
    plain = tmp_path / "plain"  # runs that do not say: no line
    fake_run(plain, "AVG", 2, 0, 0.5)
    write_report(plain, formats=PNG)
    assert "Network measured" not in (plain / "report" / "table1.md").read_text()


def test_the_baselines_name_their_network():
    from fdlit.federation.baselines import measured_network
    from fdlit.methods import FedAvg, FedProto

    assert measured_network("local_only", FedAvg()) == "each client's own network"
    assert "reference" in measured_network("reference", FedProto())
    assert measured_network("fd", FedAvg()).startswith("the averaged model")
