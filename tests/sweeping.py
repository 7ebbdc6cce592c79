"""Sweep files and what a sweep leaves behind, for the sweep tests (not a test module: tests import these
instead of importing each other)."""

import json
from pathlib import Path

import yaml

TINY = [  # a few seconds per run on one CPU core
    "--logger.mode", "disabled", "--logger.progress", "false",
    "--federation.rounds", "1", "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
    "--data.num_clients", "5", "--data.public_size", "100", "--model.hidden", "[16]",
]


def write_sweep(tmp_path, parameters, command=None, name="tiny"):
    spec = {"name": name, "method": "grid", "parameters": parameters,
            "command": command or ["${env}", "${interpreter}", "-m", "fdlit", "fit", "--config", "digits.yaml",
                                   "${args}"]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def finished_dirs(run_dir):
    return sorted(p.parent for p in Path(run_dir).glob("*/summary.json")
                  if json.loads(p.read_text()).get("finished"))


def children(pid: int) -> set[int]:
    """Process ids whose parent is ``pid`` (from /proc; Linux)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
