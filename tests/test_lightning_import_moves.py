"""Lightning or torchmetrics releases laid out otherwise than fdlit's deferred import expects
(fdlit.clients.lightning_import), simulated in a fresh interpreter by running a line before a module's
own code: fdlit still imports, a digits ``fit`` gives the same numbers as without the change, and one
note says what fdlit did instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
        "--federation.rounds", "1", "--federation.private_epochs_first", "1", "--federation.public_epochs_first", "1",
        "--data.num_clients", "3", "--data.classes_per_client", "4", "--data.public_size", "100"]

# runs `prelude` in a module's namespace before the module's own code, as a release that added it would
HOOK = """
import importlib.machinery, sys

class Prelude:
    def __init__(self, name, prelude):
        self.name, self.prelude = name, prelude

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run, prelude = spec.loader.exec_module, self.prelude

        def exec_module(module):
            exec(prelude, module.__dict__)
            run(module)

        spec.loader.exec_module = exec_module
        return spec
"""

MOVES = {
    # a Lightning release that imports a torch._dynamo submodule while it loads
    "dynamo submodule": [("lightning.fabric.wrappers", "from torch._dynamo.eval_frame import OptimizedModule as _M")],
    # a torchmetrics release whose modules take a new name from the package (set by its __init__)
    "torchmetrics package name": [("torchmetrics", "_RELEASE_NAME = 'new'"),
                                  ("torchmetrics.metric", "from torchmetrics import _RELEASE_NAME")],
}
NOTES = {"dynamo submodule": "torch._dynamo.eval_frame was imported while Lightning loaded: torch._dynamo is "
                             "loaded in full",
         "torchmetrics package name": "Lightning's import with torchmetrics and torch._dynamo deferred failed "
                                      "(ImportError"}


def fit(run_dir: Path, hooks: list[tuple[str, str]]) -> tuple[list[dict], str]:
    """A tiny digits fit in a fresh interpreter with ``hooks`` installed first: its rows (timings aside)
    and its stderr."""
    code = HOOK + "".join(f"sys.meta_path.insert(0, Prelude({n!r}, {p!r}))\n" for n, p in hooks) + f"""
from fdlit.cli import main
rc = main(["fit", *{TINY!r}, "--logger.run_dir", {str(run_dir)!r}])
import torch._dynamo
assert type(sys.modules["torch._dynamo"]).__name__ == "module" and hasattr(torch._dynamo, "reset")
sys.exit(rc)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics,) = run_dir.glob("*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in rows], out.stderr


@pytest.fixture(scope="module")
def unchanged(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("unchanged"), [])


def test_the_unchanged_import_says_nothing(unchanged):
    rows, err = unchanged
    assert rows and "fdlit: note:" not in err


@pytest.mark.parametrize("move", list(MOVES))
def test_a_moved_internal_still_fits_the_same_and_says_once_what_fdlit_did(unchanged, tmp_path, move):
    rows, err = fit(tmp_path, MOVES[move])
    notes = [line for line in err.splitlines() if line.startswith("fdlit: note:")]
    assert len(notes) == 1 and NOTES[move] in notes[0], err[-3000:]
    assert rows == unchanged[0]
