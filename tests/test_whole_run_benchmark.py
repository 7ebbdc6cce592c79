"""benchmarks/whole_run.py counts the CPU of every process a run starts, also one that outlives it
(W&B's service does), and the plain loop it compares against learns."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import plain_fd  # noqa: E402
import whole_run  # noqa: E402

# the child starts a grandchild that burns ~0.4 CPU s after the child has exited (an orphan)
ORPHAN = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c",
                  "import time; time.sleep(0.3); t = time.process_time()\\nwhile time.process_time() - t < 0.4: pass"])
"""


def test_measure_counts_the_cpu_of_an_orphaned_grandchild():
    code = f"""
import sys
sys.path.insert(0, {str(REPO / 'benchmarks')!r})
import whole_run
whole_run.become_subreaper()
cpu, wall = whole_run.measure([sys.executable, "-c", {ORPHAN!r}], {{}})
print(cpu, wall)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    cpu, wall = map(float, out.stdout.split())
    assert cpu >= 0.4 and wall >= 0.3


def test_plain_loop_learns_beyond_each_clients_own_classes():
    out = plain_fd.main(["--rounds", "1", "--clients", "5"])
    # a client holds 2 of 10 classes (~0.2 of the test set); the teacher of 5 clients spans all 10
    assert out["accuracy"] > 0.25 and out["cpu_s"] > 0
    assert whole_run.ROOT == REPO
