"""glibc keeps a run's large freed blocks: a large tensor comes from the heap, not a fresh mapping, and
its memory stays in the heap when it is dropped, so the next step's tensor does not page-fault it in
again (glibc's own accounting, ``mallinfo2``, in a fresh interpreter each)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")

CHILD = """
import ctypes, sys, torch
from fdlit.execution.allocator import keep_large_blocks

class MallInfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):
    print("no-mallinfo2 0 0"); sys.exit()
libc.mallinfo2.restype = MallInfo2
tuned = keep_large_blocks() if sys.argv[1] == "tuned" else None
before = libc.mallinfo2().hblkhd
block = torch.ones(3_000_000, dtype=torch.float64)  # 24 MB: a step's temporary
mapped = libc.mallinfo2().hblkhd - before
del block
print(tuned, mapped, libc.mallinfo2().fordblks)
"""
BLOCK = 24_000_000


def allocation(mode: str, **env: str) -> tuple[str, int, int]:
    """(whether it was set, bytes mmapped for a fresh 24 MB tensor, free heap bytes once it is dropped)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", CHILD, mode], env={**clean, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1]), int(out[2])


def test_large_blocks_come_from_the_heap_and_stay_there():
    tuned, mapped, kept = allocation("tuned")
    if tuned != "True":
        pytest.skip(f"not glibc >= 2.33 ({tuned})")
    assert mapped == 0 and kept >= BLOCK  # served from the heap, and kept there for the next step
    _, mapped, kept = allocation("default")
    assert mapped >= BLOCK and kept < BLOCK  # glibc's default: a fresh mapping, unmapped on free


def test_the_users_allocator_settings_are_left_alone():
    tuned, mapped, _ = allocation("tuned", MALLOC_ARENA_MAX="2")
    assert tuned == "False" and mapped >= BLOCK


def test_fit_and_the_node_worker_set_it(monkeypatch, tmp_path):
    """The processes that train clients set it: ``fdlit fit`` (and ``deploy``), Flower's node worker
    (Ray's actors call it in ``ClientWorker.__init__``)."""
    from fdlit import cli
    from fdlit.deployment import node
    from fdlit.execution import allocator

    calls = []
    monkeypatch.setattr(allocator, "keep_large_blocks", lambda: calls.append(1) or True)
    assert cli.main(["fit", "--config", str(ROOT / "configs" / "digits.yaml"), "--federation.rounds", "1", "--data.num_clients", "5",
                     "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", str(tmp_path)]) == 0
    assert calls == [1]
    key = tmp_path / "worker.key"
    key.write_bytes(b"k" * 32)
    monkeypatch.setattr(node, "serve", lambda *args: None)
    node.main(["--socket", "x", "--authkey-file", str(key)])
    assert calls == [1, 1]
