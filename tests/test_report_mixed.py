"""A researcher's mixed runs folder: two datasets, three methods, a changed τ, a run with a bigger
network and other rounds, one seed and three seeds, a run linked in. The report draws one section
per dataset, labels rows by only what tells them apart (<= 60 characters), keeps legends inside
their figures, and `fdlit report A B` reads chosen runs."""

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from fdlit.cli import main
from fdlit.reporting import load_runs
from fdlit.reporting.groups import MAX_LABEL

AGGREGATORS = {
    "AVG": {"class_path": "fdlit.methods.ProbabilityAveraging", "init_args": {}},
    "UWA": {"class_path": "fdlit.methods.UncertaintyWeighted", "init_args": {}},
    "sUWA": {"class_path": "fdlit.methods.SmoothedUncertaintyWeighted", "init_args": {"tau": 0.25}},
    "ERA": {"class_path": "fdlit.methods.EntropyReduction", "init_args": {"temperature": 0.1}},
}


def run_dir(root: Path, name: str, dataset="digits", method="AVG", seed=0, tau=0.25, best=0.5, rounds=3,
            hidden=(128, 128), lr=0.001, num_clients=20, data_dir=None, server=None, sigma=None) -> Path:
    """A finished run directory in the on-disk format RunDirectory writes (config, metrics, summary)."""
    path = root / name
    path.mkdir(parents=True)
    aggregator = json.loads(json.dumps(AGGREGATORS[method]))
    if method == "sUWA":
        aggregator["init_args"]["tau"] = tau
    config = {"seed": seed,
              "data": {"dataset": dataset, "num_clients": num_clients, "partition": "classes", "classes_per_client": 2,
                       **({"data_dir": data_dir} if data_dir else {})},
              "model": {"class_path": "fdlit.models.MLP", "init_args": {"hidden": list(hidden)}},
              "client": {"optimizer": "adam", "lr": lr, "batch_size": 32},
              "aggregator": aggregator, "federation": {"rounds": rounds, "mode": "fd"},
              "logger": {"name": name, "run_dir": str(root)},
              **({"server": server} if server else {}), **({"privacy": {"noise_multiplier": sigma}} if sigma else {})}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"round": r, "after_public/global_acc_mean": best - 0.05 * (rounds - r),
             "after_public/local_acc_mean": 0.9, "after_private/global_acc_mean": best - 0.1,
             "comm/up_bytes_total": 1000 * r, "comm/down_bytes_total": 2000 * r} for r in range(1, rounds + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (path / "summary.json").write_text(json.dumps({"finished": True, "rounds": rounds}))
    return path


@pytest.fixture
def mixed(tmp_path):
    root = tmp_path / "runs"
    for seed in range(3):  # three seeds of sUWA and AVG on digits
        run_dir(root, f"digits-suwa-s{seed}", method="sUWA", seed=seed, best=0.6 + 0.01 * seed)
        run_dir(root, f"digits-avg-s{seed}", method="AVG", seed=seed, best=0.5 + 0.01 * seed)
    run_dir(root, "digits-uwa", method="UWA", best=0.55)  # one seed
    run_dir(root, "digits-suwa-tau05", method="sUWA", tau=0.5, best=0.62)  # a changed τ
    # the README's walk: a bigger network trained longer at another rate on more clients, all at once
    run_dir(root, "digits-avg-big", method="AVG", hidden=(256, 128), rounds=5, lr=0.01, num_clients=40, best=0.7)
    for seed in range(3):
        run_dir(root, f"fmnist-avg-s{seed}", dataset="fashion_mnist", method="AVG", seed=seed, best=0.4)
    run_dir(root, "fmnist-uwa", dataset="fashion_mnist", method="UWA", best=0.45)
    # a run kept elsewhere, linked into the folder: followed
    elsewhere = run_dir(tmp_path / "kept", "fmnist-suwa", dataset="fashion_mnist", method="sUWA", best=0.47)
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)
    return root


def captured_figures(monkeypatch):
    """Every figure the report saves, with its file stem."""
    import fdlit.reporting.write as write

    saved = []
    real = write.save_figure

    def save(fig, folder, stem, formats=("png",)):
        png = real(fig, folder, stem, formats)
        saved.append((stem, fig))
        return png

    monkeypatch.setattr(write, "save_figure", save)
    return saved


def test_a_mixed_folder_gets_a_section_per_dataset_short_labels_and_legends_inside(mixed, tmp_path, monkeypatch):
    saved = captured_figures(monkeypatch)
    out = tmp_path / "report"
    assert main(["report", str(mixed), "--out", str(out), "--formats", "png"]) == 0
    page, md = (out / "index.html").read_text(), (out / "table1.md").read_text()

    # one section per dataset, each its own figures: digits' curves never hold a Fashion-MNIST run
    stems = [stem for stem, _ in saved]
    assert stems.count("digits_appB_accuracy_curves") == 1 and stems.count("fashion_mnist_appB_accuracy_curves") == 1
    assert not any(s.startswith(("appB", "figure2")) for s in stems)  # nothing drawn across datasets
    assert "## digits" in md and "## fashion_mnist" in md

    # the linked run is read, the one-seed and three-seed cells are both there
    runs, _ = load_runs(mixed)
    assert any(r.path.name == "linked" for r in runs) and len(runs) == 14

    # labels name only what tells the groups apart: the big run differs in four settings, one is enough
    labels = {r.method for r in runs}
    assert all(len(label) <= MAX_LABEL for label in labels), labels
    digits = {r.method for r in runs if r.dataset == "digits"}
    big = next(r.method for r in runs if r.path.name == "digits-avg-big")
    assert big.startswith("[") and big.endswith("] AVG") and big.count("=") == 1, big
    assert "sUWA τ=0.5" in " ".join(digits) and "sUWA τ=0.25" in " ".join(digits)
    assert not any(label.startswith("[") for label in labels if "fashion" in label)
    assert not any(r.group for r in runs if r.dataset == "fashion_mnist")  # nothing to tell apart there
    # the legend table lists every setting the digits groups differ in, in full
    for key in ("model.init_args.hidden", "client.lr", "data.num_clients", "federation.rounds"):
        assert f"<code>{key}</code>" in page and key in md
    # each table states how its numbers were picked, each row by its own rule
    assert md.count("Selection (column \"selected by\"): each run's round of best test accuracy") == 2
    assert " | test |\n" in md and "| validation |" not in md  # no run of this folder has a validation set

    for stem, fig in saved:
        texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        assert all(len(line) <= MAX_LABEL for text in texts for line in text.split("\n")), (stem, texts)
        assert legend_inside(fig), (stem, texts)
        if stem.startswith("fashion_mnist_"):
            assert not any("τ=0.5" in t or "[" in t for t in texts), (stem, texts)


def legend_inside(fig) -> bool:
    """Whether every legend of a saved figure, and each of its entries, lies inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # at the figure's own dpi, in the layout it was saved in
    renderer, box = canvas.get_renderer(), fig.bbox
    extents = [a.get_window_extent(renderer) for legend in fig.legends for a in [legend, *legend.get_texts()]]
    return bool(extents) and all(e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y0 >= box.y0 - 1
                                 and e.y1 <= box.y1 + 1 for e in extents)


def test_a_label_of_the_longest_allowed_length_is_wrapped_inside_a_one_column_figure(tmp_path):
    from fdlit.reporting.paper_figures import legend_below, new_figure, paper_style, save_figure

    label = "[hidden=[256,128], lr=0.01] Local only (no communication)!!!"[:MAX_LABEL]
    assert len(label) == MAX_LABEL
    with paper_style():
        fig, axes = new_figure(1)
        for i in range(3):
            axes[0, 0].plot([0, 1], [i, i], label=f"{label[:-1]}{i}")
        legend_below(fig, axes[0, 0])
        save_figure(fig, tmp_path, "long", ("png",))
    assert legend_inside(fig)


def test_groups_too_long_to_name_are_lettered_with_the_full_settings_in_the_legend(tmp_path):
    root = tmp_path / "runs"
    long_dir = "/data/" + "a-very-long-folder-name-" * 3
    run_dir(root, "a", method="AVG")
    run_dir(root, "b", method="AVG", data_dir=long_dir)
    runs, _ = load_runs(root)
    assert sorted(r.method for r in runs) == ["[A] AVG", "[B] AVG"]
    assert {r.group_settings["data.data_dir"] for r in runs} == {"default", long_dir}
    assert main(["report", str(root), "--out", str(tmp_path / "out"), "--formats", "png"]) == 0
    md = (tmp_path / "out" / "table1.md").read_text()
    assert re.search(rf"\| \[B\] \| {re.escape(long_dir)} \|", md) and "| [A] | default |" in md


def test_a_method_files_own_settings_name_the_method_not_a_group(tmp_path):
    """DS-FL is ERA with a server model: its row says DS-FL, and the server section every DS-FL run
    shares (and no other method has) makes no group; the noise multiplier the runs differ in does."""
    root = tmp_path / "runs"
    server = {"model": {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [128, 128]}}, "batch_size": 32}
    for sigma in (None, 0.01):
        run_dir(root, f"avg-{sigma}", method="AVG", sigma=sigma)
        run_dir(root, f"dsfl-{sigma}", method="ERA", server=server, sigma=sigma)
    run_dir(root, "era", method="ERA", sigma=0.01)  # ERA alone: no server model, no DS-FL
    runs, _ = load_runs(root)
    labels = sorted(r.method for r in runs)
    assert labels == sorted(["[noise_multiplier=default] AVG", "[noise_multiplier=0.01] AVG",
                             "[noise_multiplier=default] DS-FL", "[noise_multiplier=0.01] DS-FL",
                             "[noise_multiplier=0.01] ERA"]), labels
    assert all(set(r.group_settings) == {"privacy.noise_multiplier"} for r in runs)


def test_report_of_chosen_runs_and_a_link_out_of_a_run_is_not_followed(mixed, tmp_path, capsys):
    a, b = mixed / "digits-avg-s0", mixed / "fmnist-uwa"
    assert main(["report", str(a), str(b), "--formats", "png"]) == 0
    index = Path(capsys.readouterr().out.split("fdlit report: ")[-1].strip())
    assert index == mixed / "report" / "index.html"  # beside the chosen runs, never inside one
    page = index.read_text()
    assert "2 run(s)" in page and "digits-avg-s0" in page and "fmnist-uwa" in page
    # a folder linked from inside a run is not searched: a run is read only for its own files
    outside = run_dir(tmp_path / "other", "outside", method="UWA")
    os.symlink(outside, a / "more", target_is_directory=True)
    runs, _ = load_runs(a)
    assert [r.path for r in runs] == [a]
    # a missing folder among the chosen ones is named
    assert main(["report", str(a), str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
