"""A section given on the command line, as a file or as YAML text, is read within a config file's bounds
(fdlit.configuration.bounded_yaml.check_arguments): one line, exit status 2, little CPU and memory, whatever it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALIAS_BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
                       + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]) + "\n"
DEEP = "[" * 5000 + "]" * 5000 + "\n"
# runs the command as its child and reports the child's exit status, stderr, CPU seconds and peak RSS
MEASURED = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)
use = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": done.returncode, "err": done.stderr, "cpu": use.ru_utime + use.ru_stime,
                  "rss_mb": use.ru_maxrss / 1024}))
"""


def measured(tmp_path: Path, *args: str) -> dict:
    fit = [sys.executable, "-m", "fdlit", "fit", "--config", "digits.yaml", "--logger.mode", "disabled",
           "--logger.run_dir", str(tmp_path / "runs"), *args]
    done = subprocess.run([sys.executable, "-c", MEASURED, *fit], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def start_up(tmp_path_factory) -> float:
    """The CPU seconds of a refusal that reads nothing: what starting fdlit costs."""
    out = measured(tmp_path_factory.mktemp("start"), "--data.num_clients", "0")
    assert out["rc"] == 2
    return out["cpu"]


def special(kind: str, folder: Path) -> str:
    if kind == "fifo":
        os.mkfifo(folder / "s.yaml")  # nobody writes it: opening it for reading would wait forever
        return "s.yaml"
    if kind == "300 MB file":
        with open(folder / "s.yaml", "wb") as f:
            f.truncate(300 * 2**20)
        return "s.yaml"
    if kind in ("alias bomb file", "5000-deep file"):
        (folder / "s.yaml").write_text(ALIAS_BOMB if kind == "alias bomb file" else DEEP)
        return "s.yaml"
    return {"alias bomb text": ALIAS_BOMB, "5000-deep text": DEEP, "/proc/self/mem": "/proc/self/mem",
            "/dev/zero": "/dev/zero"}[kind]


CASES = [("data", "fifo", "s.yaml is not a regular file"), ("model", "fifo", "s.yaml is not a regular file"),
         ("privacy", "fifo", "s.yaml is not a regular file"),
         ("data", "300 MB file", "s.yaml is larger than 1024 KiB"),
         ("data", "alias bomb file", "s.yaml, line 1: it expands to more than 100,000 values"),
         ("data", "5000-deep file", "s.yaml, line 1: nested deeper than 64 levels"),
         ("data", "alias bomb text", "its YAML text, line 1: it expands to more than 100,000 values"),
         ("federation", "5000-deep text", "its YAML text, line 1: nested deeper than 64 levels"),
         ("data", "/proc/self/mem", "/proc/self/mem is a file of the kernel"),
         ("aggregator", "/dev/zero", "/dev/zero is not a regular file")]


@pytest.mark.parametrize("option,kind,expected", CASES, ids=[f"--{o} {k}" for o, k, _ in CASES])
def test_a_section_on_the_command_line_is_read_within_bounds(option, kind, expected, tmp_path, start_up):
    out = measured(tmp_path, f"--{option}", special(kind, tmp_path))
    err = out["err"].strip().splitlines()
    assert out["rc"] == 2 and len(err) == 1, out["err"][-2000:]
    assert err[0].startswith(f"fdlit: error: {option}: ") and expected in err[0], err
    assert out["cpu"] < start_up + 2, (out["cpu"], start_up)
    assert out["rss_mb"] <= 300, out["rss_mb"]
    assert not (tmp_path / "runs").exists()


def test_a_section_file_within_bounds_still_configures_the_run(tmp_path):
    """The check reads the file and lets it through: jsonargparse then loads it as before."""
    from fdlit.configuration.schema import parse_fit

    (tmp_path / "fed.yaml").write_text("rounds: 3\n")
    _, cfg = parse_fit(["--config", "digits.yaml", "--federation", str(tmp_path / "fed.yaml")])
    assert cfg.federation.rounds == 3


def test_the_file_options_are_the_parsers():
    """Every option jsonargparse loads from a file (a section, a class) is one the check reads."""
    from fdlit.configuration.code_allowlist import FILE_OPTIONS
    from fdlit.configuration.schema import fit_parser

    parser = fit_parser()
    sections = {a.dest for a in parser._actions if type(a).__name__ == "_ActionConfigLoad"}
    classes = {a.dest for a in parser._actions if type(a).__name__ == "_ActionHelpClassPath"}
    assert sections and classes
    assert sections | {c.removesuffix(".help") for c in classes} <= set(FILE_OPTIONS) | {"server"}
