"""A node's own data folder (node-config local-data) is read within bounds (fdlit.data.idx): a gzip bomb,
a sparse file, a corrupt gzip stream, a link into /proc or a pipe is refused in one line, exit status 2,
before it is read to its end."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGES, LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
MEASURED = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)
use = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": done.returncode, "err": done.stderr, "cpu": use.ru_utime + use.ru_stime,
                  "rss_mb": use.ru_maxrss / 1024}))
"""


def header(n: int) -> bytes:
    return struct.pack(">BBBBIII", 0, 0, 8, 3, n, 28, 28)


def labels(n: int) -> bytes:
    return struct.pack(">BBBBI", 0, 0, 8, 1, n) + bytes(n)


def gzip_bomb(path: Path, n: int) -> None:
    """A gzip file of n 28 x 28 zero images: ~1000 times smaller than what it unpacks to. Written as
    gzip's concatenated members (one stream to every reader, gzip's own included), so the gigabytes
    are compressed once per 4 MiB, not each time."""
    chunk = 2**22
    full, rest = divmod(n * 784, chunk)
    member = gzip.compress(bytes(chunk), compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(header(n), compresslevel=9))
        for _ in range(full):
            f.write(member)
        f.write(gzip.compress(bytes(rest), compresslevel=9))


def make(kind: str, folder: Path) -> str:
    """A data folder of the given kind; the text the refusal holds."""
    folder.mkdir()
    (folder / f"{LABELS}.gz").write_bytes(gzip.compress(labels(60)))
    images = folder / f"{IMAGES}.gz"
    if kind == "gzip bomb over the size cap":
        gzip_bomb(images, 3_000_000)  # 3 MB declaring and holding 2.4 GB
        return "more than the 2,147,483,648 bytes fdlit reads of one file"
    if kind == "gzip bomb under the size cap":
        gzip_bomb(images, 600_000)  # 0.5 MB declaring and holding 470 MB
        return "over 100 times the"
    if kind == "gzip stream longer than its header":
        images.write_bytes(gzip.compress(header(60) + bytes(60 * 784 + 10**7)))
        return "the file holds more than that bytes"
    if kind == "corrupt gzip":
        good = gzip.compress(header(60) + os.urandom(60 * 784))
        images.write_bytes(good[:30] + bytes(b ^ 0xFF for b in good[30:200]) + good[200:])
        return "cannot read it (not a gzip file or a damaged one)"
    (folder / f"{LABELS}.gz").unlink()
    (folder / LABELS).write_bytes(labels(60))
    images = folder / IMAGES
    if kind == "sparse 3 GB file":
        with open(images, "wb") as f:
            f.write(header(60))
            f.truncate(3 * 10**9)
        return "header says shape (60, 28, 28) (47,040 bytes), the file holds"
    if kind == "link to /proc/self/mem":
        images.symlink_to("/proc/self/mem")
        return "is a file of the kernel (/proc, /sys)"
    if kind == "pipe":
        os.mkfifo(images)  # nobody writes it
        return "is not a regular file"
    raise AssertionError(kind)


KINDS = ["gzip bomb over the size cap", "gzip bomb under the size cap", "gzip stream longer than its header",
         "corrupt gzip", "sparse 3 GB file", "link to /proc/self/mem", "pipe"]


def measured(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURED, *argv], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(done.stdout)


def read_folder(folder: str) -> list[str]:
    """The node's data read as its start check reads it, alone in a process (exit 2 with the line)."""
    code = ("import sys\nfrom fdlit.data.node_local import read_node_data\nfrom fdlit.errors import ConfigError\n"
            "try:\n    read_node_data(sys.argv[1])\nexcept ConfigError as exc:\n"
            "    print(f'fdlit: error: {exc}', file=sys.stderr)\n    sys.exit(2)\n")
    return [sys.executable, "-c", code, folder]


@pytest.fixture(scope="module")
def start_up() -> dict:
    """What reading a folder that is not there costs: the imports."""
    out = measured(*read_folder("/nowhere"))
    assert out["rc"] == 2
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_node_folder_is_refused_within_bounds(kind, tmp_path, start_up):
    folder = tmp_path / "data"
    expected = make(kind, folder)
    out = measured(*read_folder(str(folder)))
    err = out["err"].strip().splitlines()
    assert out["rc"] == 2 and len(err) == 1, out["err"][-2000:]
    assert err[0].startswith(f"fdlit: error: node-config local-data: {folder}/") and expected in err[0], err
    assert out["cpu"] < start_up["cpu"] + 2, (out["cpu"], start_up["cpu"])
    assert out["rss_mb"] <= 300 and out["rss_mb"] < start_up["rss_mb"] + 30, (out["rss_mb"], start_up["rss_mb"])


@pytest.mark.parametrize("kind", ["gzip bomb over the size cap", "corrupt gzip", "link to /proc/self/mem"])
def test_a_supernode_refuses_a_hostile_folder_at_its_start(kind, tmp_path):
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    folder = tmp_path / "data"
    expected = make(kind, folder)
    node = [sys.executable, "-m", "fdlit.deployment.supernode", "--insecure", "--superlink", "127.0.0.1:1",
            "--node-config", f"local-data='{folder}'"]
    base = measured(*node[:-1], "local-data='/nowhere'")
    out = measured(*node)
    err = out["err"].strip().splitlines()
    assert base["rc"] == 2 and out["rc"] == 2 and len(err) == 1 and expected in err[0], out["err"][-2000:]
    assert out["cpu"] < base["cpu"] + 2 and out["rss_mb"] < base["rss_mb"] + 30, (out, base)
    assert out["rss_mb"] <= 300, out  # checked before the SuperNode and torch are imported


def test_an_intact_gzipped_folder_still_reads(tmp_path):
    """Blank images pack far tighter than the ratio allows a large file: a small one is read."""
    from fdlit.data.node_local import read_node_data

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / f"{IMAGES}.gz").write_bytes(gzip.compress(header(60) + bytes(60 * 784)))
    (folder / f"{LABELS}.gz").write_bytes(gzip.compress(labels(60)))
    assert (60 * 784) / (folder / f"{IMAGES}.gz").stat().st_size > 100
    x, y = read_node_data(folder)
    assert x.shape == (60, 28, 28) and y.tolist() == [0] * 60
