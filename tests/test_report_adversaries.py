"""The report's adversaries figures: one per attack, the honest clients' accuracy against the share of
attackers, the 0 % point from the runs of the same setting without attackers."""

import json
import math
import shutil

import numpy as np
import pytest
import yaml

from fdlit.cli import main
from fdlit.reporting import load_runs, write_report
from fdlit.reporting.adversaries import attack_lines, attacked_share
from fdlit.runs import read_jsonl
from tests.fitting import tiny

FLIP = ["--adversaries.attack", "fdlit.adversaries.LabelFlipping"]
RULES = {"AVG": "digits_avg.yaml", "UWA": "digits_uwa.yaml"}
FRACTIONS = (0.0, 0.25, 0.5)


def last(run, key):
    values = [row[key] for row in read_jsonl(run / "metrics.jsonl") if row.get(key) is not None]
    return [v for v in values if math.isfinite(v)][-1]


def copy_as(run, dest, seed=None, edit=None, shift=0.0):
    """A copy of a run directory with another seed or setting and its accuracies shifted."""
    shutil.copytree(run, dest)
    config = yaml.safe_load((dest / "config.yaml").read_text())
    if seed is not None:
        config["seed"] = seed
    if edit:
        edit(config)
    (dest / "config.yaml").write_text(yaml.safe_dump(config))
    rows = read_jsonl(dest / "metrics.jsonl")
    for row in rows:
        for key in ("adversaries/honest_global_acc", "after_public/global_acc_mean"):
            if row.get(key) is not None:
                row[key] += shift
    (dest / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return dest


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Real 1-round runs: AVG and UWA flipping labels at 0 (no section), 25 and 50 % of 4 clients; a
    second seed as shifted copies; a clean AVG run of another setting (must never be a 0 % point) and
    the AVG runs again under another attack."""
    root = tmp_path_factory.mktemp("adversaries") / "runs"
    made = {}
    for rule, config in RULES.items():
        for f in FRACTIONS:
            parent = root / f"{rule}-{f}-seed0"
            attack = FLIP + ["--adversaries.fraction", str(f)] if f else []
            assert main(["fit", *tiny(config, parent, *attack, rounds=1)]) == 0
            (made[(rule, f, 0)],) = [p for p in parent.iterdir() if p.is_dir()]
            made[(rule, f, 1)] = copy_as(made[(rule, f, 0)], root / f"{rule}-{f}-seed1" / "run", seed=1, shift=0.1)

    def other_setting(config):
        config["data"]["public_size"] = 99

    copy_as(made[("AVG", 0.0, 0)], root / "decoy" / "run", edit=other_setting, shift=0.5)

    def confident_wrong(config):
        config["adversaries"]["attack"] = {"class_path": "fdlit.adversaries.ConfidentWrong",
                                           "init_args": {"target": 0, "confidence": 10.0}}

    copy_as(made[("AVG", 0.25, 0)], root / "wrong" / "run", edit=confident_wrong)
    return root, made


def test_points_are_the_honest_accuracy_per_share_of_attackers_over_seeds(study):
    root, made = study
    runs, _ = load_runs(root)
    lines = {label: lines for label, lines in attack_lines(runs).values()}
    assert set(lines) == {"LabelFlipping", "ConfidentWrong(confidence=10.0, target=0)"}
    flip = {line.label: line for line in lines["LabelFlipping"]}
    assert set(flip) == {"AVG", "UWA"}  # the decoy of another setting made no line of its own
    for rule, line in flip.items():
        x, mean, std = line.points()
        assert x.tolist() == list(FRACTIONS)
        for i, f in enumerate(FRACTIONS):
            key = "adversaries/honest_global_acc" if f else "after_public/global_acc_mean"
            values = [last(made[(rule, f, seed)], key) for seed in (0, 1)]
            assert mean[i] == pytest.approx(np.mean(values)) and std[i] == pytest.approx(np.std(values, ddof=1))
    x, weight, _ = flip["AVG"].points("weight")
    assert x.tolist() == list(FRACTIONS) and weight == pytest.approx(FRACTIONS)  # AVG: their share of clients
    (wrong,) = lines["ConfidentWrong(confidence=10.0, target=0)"]
    x, mean, _ = wrong.points()  # its 0 % point: the same clean AVG runs, not the decoy
    assert wrong.label == "AVG" and x.tolist() == [0.0, 0.25]
    assert mean[0] == pytest.approx(flip["AVG"].points()[1][0])


def test_report_draws_one_figure_per_attack_and_lists_it(study, tmp_path, monkeypatch):
    root, _ = study
    monkeypatch.setattr("fdlit.reporting.write.trust_figures", lambda runs: [])  # 14 matrices: slow, tested elsewhere
    index = write_report(root, tmp_path / "out", formats=("png",))
    figures = sorted(p.name for p in (tmp_path / "out" / "figures").glob("adversaries_*.png"))
    assert figures == ["adversaries_ConfidentWrong_confidence=10.0,_target=0_.png", "adversaries_LabelFlipping.png"]
    page = index.read_text()
    assert page.count('alt="adversaries_') == 2 and "Attack LabelFlipping" in page


def test_share_of_attackers_from_count_fraction_or_ids():
    attack = {"class_path": "fdlit.adversaries.LabelFlipping"}

    def share(**section):
        return attacked_share({"data": {"num_clients": 20}, "adversaries": {"attack": attack, **section}})

    assert share(count=4) == 0.2 and share(fraction=0.1) == 0.1 and share(ids=[1, 2, 3]) == 0.15
    assert share(fraction=0.12) == 0.1  # round(0.12 * 20) = 2 clients attack
    assert attacked_share({"data": {"num_clients": 20}, "adversaries": {"attack": None, "count": 3}}) == 0.0


def test_adversaries_table_is_honest_accuracy_and_attackers_weight_per_share(study, tmp_path, monkeypatch):
    root, made = study
    monkeypatch.setattr("fdlit.reporting.write.trust_figures", lambda runs: [])
    write_report(root, tmp_path / "out", formats=("png",))
    md = (tmp_path / "out" / "adversaries.md").read_text()
    flip = md.split("### Attack LabelFlipping", 1)[1].split("### Attack", 1)[0]
    assert "| rule | 0 % | 25 % | 50 % |" in flip
    for rule in RULES:
        line = next(line for line in flip.splitlines() if line.startswith(f"| {rule} |"))
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        for f, cell in zip(FRACTIONS, cells, strict=True):
            key = "adversaries/honest_global_acc" if f else "after_public/global_acc_mean"
            acc = [100 * last(made[(rule, f, seed)], key) for seed in (0, 1)]
            weight = np.mean([last(made[(rule, f, seed)], "adversaries/weight") for seed in (0, 1)]) if f else 0.0
            assert cell == f"{np.mean(acc):.1f} ± {np.std(acc, ddof=1):.1f} ({weight:.2f})"
    wrong = md.split("### Attack ConfidentWrong(confidence=10.0, target=0)", 1)[1].split("### Attack", 1)[0]
    assert "| rule | 0 % | 25 % |" in wrong and "| AVG | " in wrong and "| UWA |" not in wrong
    rows = (tmp_path / "out" / "adversaries.csv").read_text().splitlines()
    assert rows[0].startswith("attack,rule,attackers,honest_accuracy_mean")
    assert sum(row.startswith("LabelFlipping,AVG,") for row in rows) == len(FRACTIONS)
