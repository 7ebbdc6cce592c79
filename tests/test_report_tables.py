"""The report's bytes table and round-budget table (bytes.md, budgets.md), through ``fdlit report``: every
cell worked out by hand from fabricated run directories."""

import json

import yaml

from fdlit.cli import main

AGGREGATORS = {"AVG": "fdlit.methods.ProbabilityAveraging", "sUWA": "fdlit.methods.SmoothedUncertaintyWeighted"}
MIB_UP = [1e6, 2e6, 3e6, 4e6]  # cumulative bytes up, all clients, by round; down is twice that
# (method, seed) -> global accuracy after the public phase by round (None: the round was not evaluated)
ACCURACY = {("AVG", 0): [0.5, 0.8, 0.9, 0.85], ("AVG", 1): [0.6, 0.7, 0.7, 0.95],
            ("sUWA", 0): [None, 0.6, None, 0.7]}


def fake_run(root, method, seed, accuracy, clients=10):
    path = root / f"{method}-seed{seed}"
    path.mkdir(parents=True)
    config = {"seed": seed, "data": {"dataset": "digits", "partition": "classes", "classes_per_client": 2,
                                     "num_clients": clients},
              "aggregator": {"class_path": AGGREGATORS[method], "init_args": {}},
              "federation": {"rounds": len(accuracy), "mode": "fd"}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"round": r, "after_public/global_acc_mean": acc, "after_public/local_acc_mean": acc,
             "after_private/global_acc_mean": acc, "comm/up_bytes_total": MIB_UP[r - 1],
             "comm/down_bytes_total": 2 * MIB_UP[r - 1]} for r, acc in enumerate(accuracy, 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (path / "summary.json").write_text(json.dumps({"finished": True, "rounds": len(accuracy)}))


def table(md: str) -> dict[tuple[str, str], list[str]]:
    """(method, k) -> the row's other cells, from a Markdown table with method and k first."""
    out = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2 and cells[1].isdigit():
            out[(cells[0], cells[1])] = cells[2:]
    return out


def report(tmp_path, *flags):
    root = tmp_path / "runs"
    for (method, seed), accuracy in ACCURACY.items():
        fake_run(root, method, seed, accuracy)
    assert main(["report", str(root), "--formats", "png", *flags]) == 0
    return root / "report"


def test_bytes_table_is_accuracy_rounds_and_mb_per_client_to_95_percent_of_the_best(tmp_path):
    out = report(tmp_path)
    md = (out / "bytes.md").read_text()
    assert ("| method | k | accuracy after the last round (%) | best accuracy (%) | rounds to 95 % of best | "
            "MB per client to 95 % of best | MB per client up | MB per client down |") in md
    rows = table(md)
    # AVG seed 0 reaches 0.855 in round 3 (9e6 bytes / 10 clients), seed 1 reaches 0.9025 in round 4 (12e6 / 10)
    assert rows[("AVG", "2")] == ["90.00 ± 7.07", "92.50 ± 3.54", "3.5 ± 0.7", "1.050 ± 0.212", "0.400 ± 0.000",
                                  "0.800 ± 0.000"]
    # one seed: no std; rounds 1 and 3 not evaluated, so 95 % of 0.7 is first reached at round 4
    assert rows[("sUWA", "2")] == ["70.00", "70.00", "4.0", "1.200", "0.400", "0.800"]
    csv_lines = (out / "bytes.csv").read_text().splitlines()
    assert csv_lines[0] == "method,k,column,mean,std,n"
    assert "AVG,2,rounds to 95 % of best,3.5,0.7071067811865476,2" in csv_lines
    assert 'id="bytes"' in (out / "index.html").read_text()
    assert not (out / "budgets.md").exists()  # only when asked for


def test_budget_table_is_the_best_accuracy_within_the_first_r_rounds(tmp_path):
    out = report(tmp_path, "--budgets", "[3,1,3]")
    rows = table((out / "budgets.md").read_text())
    assert "| method | k | R = 1 | R = 3 |" in (out / "budgets.md").read_text()  # sorted, no repeats
    assert rows[("AVG", "2")] == ["55.00 ± 7.07", "80.00 ± 14.14"]  # R = 3: 0.9 and 0.7
    assert rows[("sUWA", "2")] == ["–", "60.00"]  # round 1 not evaluated: nothing within R = 1
    assert "Round budgets" in (out / "index.html").read_text()


def test_budgets_refused_below_one_round(tmp_path, capsys):
    root = tmp_path / "runs"
    fake_run(root, "AVG", 0, ACCURACY[("AVG", 0)])
    assert main(["report", str(root), "--budgets", "[5,0]"]) == 2
    assert "budgets: must be whole numbers of rounds >= 1" in capsys.readouterr().err
    assert not (root / "report").exists()
