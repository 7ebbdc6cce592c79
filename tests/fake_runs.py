"""Run directories as RunDirectory writes them, made by hand for tests of reading and reporting runs,
and a reader of the reports' Markdown tables (not a test module: tests import these instead of importing
each other)."""

import json
from pathlib import Path

import yaml

AGGREGATORS = {
    "AVG": {"class_path": "fdlit.methods.ProbabilityAveraging", "init_args": {}},
    "sUWA": {"class_path": "fdlit.methods.SmoothedUncertaintyWeighted", "init_args": {"tau": 0.25}},
    "UWA": {"class_path": "fdlit.methods.UncertaintyWeighted", "init_args": {}},
}


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
        row = {"round": r, "after_public/global_acc_mean": acc, "after_public/local_acc_mean": acc + 0.25,
               "after_private/global_acc_mean": acc - 0.1,
               "weights/chi": 0.05 if method == "AVG" else 0.3, "comm/up_bytes_total": 1000 * r,
               "comm/down_bytes_total": 2000 * r}
        if method == "sUWA":
            row["clients/trust_matrix"] = [[0.5, 0.5, None], [0.5, 0.5, None]]
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (path / "summary.json").write_text(json.dumps({"finished": finished, "rounds": rounds, **(summary or {})}))
    return path


def md_cells(md: str, label: str) -> list[str]:
    """Every cell of a Table 1 row after its label (one dataset: no dataset column)."""
    line = next(line for line in md.splitlines() if line.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]
