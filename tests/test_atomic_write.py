"""The one way fdlit writes a file (fdlit.runs.atomic_write): temporary file, fsync, rename; never
onto something that is not a plain file, never into another run's directory."""

import errno
import os

import pytest

from fdlit.runs.atomic_write import UnsafeTarget, check_target, write_file


def a_run(folder):
    folder.mkdir()
    (folder / "config.yaml").write_text("seed: 0\n")
    (folder / "metrics.jsonl").write_text("{}\n")
    return folder


def test_a_file_is_replaced_whole_and_nothing_else_is_left(tmp_path):
    target = tmp_path / "table.md"
    target.write_text("old")
    write_file(target, "new ü")
    write_file(tmp_path / "bytes.bin", b"\x00\x01")
    write_file(tmp_path / "by_function.bin", lambda f: f.write(b"written by a function"))
    assert target.read_text(encoding="utf-8") == "new ü" and (tmp_path / "bytes.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "by_function.bin").read_bytes() == b"written by a function"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["by_function.bin", "bytes.bin", "table.md"]


def test_links_folders_and_devices_are_refused_and_stay_what_they_were(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "folder").mkdir()
    for name, said in (("link", "is a link"), ("folder", "is a folder")):
        with pytest.raises(UnsafeTarget, match=said):
            write_file(tmp_path / name, "x")
    if os.path.exists("/dev/null"):
        with pytest.raises(UnsafeTarget, match="not a regular file"):
            check_target("/dev/null")
    with pytest.raises(UnsafeTarget, match="its folder does not exist"):
        write_file(tmp_path / "missing" / "x", "x")
    assert victim.read_text() == "keep" and (tmp_path / "link").is_symlink() and (tmp_path / "folder").is_dir()


def test_a_run_directory_is_written_only_by_its_own_run(tmp_path):
    run = a_run(tmp_path / "run")
    for name in ("checkpoint.pt", "config.yaml", "metrics.jsonl", "communication.jsonl", "run.lock", "other.txt"):
        with pytest.raises(UnsafeTarget, match="inside the run directory"):
            write_file(run / name, "x")
    assert (run / "config.yaml").read_text() == "seed: 0\n" and not (run / "other.txt").exists()
    write_file(run / "summary.json", "{}", run_dir=run)  # the run's own write
    assert (run / "summary.json").read_text() == "{}"
    (run / "report" / "deeper").mkdir(parents=True)
    for inner in (run / "report" / "index.html", run / "report" / "deeper" / "index.html"):  # at any depth
        with pytest.raises(UnsafeTarget, match=f"inside the run directory '{run.resolve()}'"):
            write_file(inner, "page")


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_one(failure, tmp_path, monkeypatch):
    target = tmp_path / "model.pt"
    target.write_bytes(b"old")

    def fails(fd):
        raise failure

    monkeypatch.setattr(os, "fsync", fails)
    with pytest.raises(type(failure)) as raised:
        write_file(target, b"new, half written")
    if isinstance(failure, OSError):
        assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
        assert str(raised.value) == f"[Errno {errno.ENOSPC}] No space left on device: '{target}'"
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_a_link_planted_as_the_temporary_file_is_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out.txt.tmp").symlink_to(victim)
    write_file(tmp_path / "out.txt", "mine")
    assert victim.read_text() == "keep" and (tmp_path / "out.txt").read_text() == "mine"
    assert not (tmp_path / "out.txt.tmp").exists()


def test_a_kept_checkpoint_is_copied_through_the_helper_where_hard_links_fail(tmp_path, monkeypatch):
    from fdlit.runs.checkpoint import CheckpointConfig, Checkpointer

    run = a_run(tmp_path / "run")
    (run / "checkpoint.pt").write_bytes(b"round 3's checkpoint")

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    Checkpointer(run, {}, settings=CheckpointConfig(keep=1))._keep(3)
    assert (run / "checkpoint-r3.pt").read_bytes() == b"round 3's checkpoint"
    assert not list(run.glob("*.tmp")) and not (run / "checkpoint-r3.pt").is_symlink()
