"""Every config fdlit parses is read within bounds (fdlit.configuration.bounded_yaml) and its sections are mappings
(fdlit.configuration.code_allowlist): one line naming the file or key, exit status 2, quickly, nothing written."""

from __future__ import annotations

import os
import time

import pytest

from fdlit.cli import main

ALIAS_BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
                       + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]) + "\n"
FLOW_BOMB = "[" + ", ".join(["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
                            + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]) + "]"


def refused(capsys, tmp_path, argv, expected: str) -> str:
    started = time.process_time()  # CPU of this process: what a bomb's expansion would cost, whatever the load
    code = main(["fit", *argv, "--logger.run_dir", str(tmp_path / "runs"), "--logger.mode", "disabled"])
    took = time.process_time() - started
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert took < 2, took
    assert not (tmp_path / "runs").exists()  # nothing written
    return err[0]


@pytest.mark.parametrize("case,content,expected", [
    ("alias bomb", ALIAS_BOMB, "expands to more than 100,000 values"),
    ("alias bomb in adversaries.ids", "adversaries:\n  ids: " + FLOW_BOMB + "\n", "expands to more than 100,000 values"),
    ("2,000,000 entries", "seed: [" + ", ".join(["0"] * 2_000_000) + "]\n", "is larger than 1024 KiB"),
    ("a 100,000-entry block list", "seed:\n" + "- 0\n" * 100_000, "more than 20,000 values"),
    ("100,000-deep list", "seed: " + "[" * 100_000 + "]" * 100_000 + "\n", "longer than 64 KiB"),
    ("1,000-deep block list", "seed:\n" + "".join("  " * i + "-\n" for i in range(1000)), "nested deeper than 64"),
])
def test_a_config_file_beyond_the_bounds_is_refused_in_one_line(case, content, expected, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(content)
    line = refused(capsys, tmp_path, ["--config", str(path)], expected)
    assert line.startswith(f"fdlit: error: config: {path}")


def test_a_config_layer_beyond_the_bounds_is_refused(tmp_path, capsys):
    (tmp_path / "bomb.yaml").write_text(ALIAS_BOMB)
    (tmp_path / "c.yaml").write_text("config: [bomb.yaml]\nseed: 1\n")
    refused(capsys, tmp_path, ["--config", str(tmp_path / "c.yaml")], f"{tmp_path / 'bomb.yaml'}, line 1: it expands")


def test_special_files_are_refused_unread(tmp_path, capsys):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # nobody writes it: opening it for reading would wait forever
    refused(capsys, tmp_path, ["--config", str(fifo)], f"config: {fifo} is not a regular file")
    refused(capsys, tmp_path, ["--config", "/dev/zero"], "config: /dev/zero is not a regular file")
    (tmp_path / "c.yaml").write_text("model: /dev/zero\n")  # a section given as a file
    refused(capsys, tmp_path, ["--config", str(tmp_path / "c.yaml")], "config: /dev/zero is not a regular file")


@pytest.mark.parametrize("value,expected", [
    (FLOW_BOMB, "adversaries.ids: its YAML text, line 1: it expands to more than 100,000 values"),
    ("[" * 100_00 + "]" * 100_00, "adversaries.ids: its YAML text, line 1: nested deeper than 64 levels"),
])
def test_a_command_line_value_beyond_the_bounds_is_refused(value, expected, tmp_path, capsys):
    line = refused(capsys, tmp_path, ["--config", "digits", "--adversaries.ids", value], expected)
    assert len(line) < 300


@pytest.mark.parametrize("content,key,got", [
    ("federation: 5\n", "federation", "got 5"),
    ("client: null\n", "client", "got null"),
    ("data: [1, 2]\n", "data", "got a list"),
    ("federation.rounds: 2\nprivacy: off\n", "privacy", "got False"),
])
def test_a_section_that_is_not_a_mapping_is_refused_naming_it(content, key, got, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(content)
    line = refused(capsys, tmp_path, ["--config", "digits", "--config", str(path)], f"{key}: must be a mapping")
    assert got in line and str(path) in line


def test_a_sweep_file_that_is_a_pipe_is_refused(tmp_path, capsys):
    fifo = tmp_path / "sweep.yaml"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert main(["sweep", str(fifo), "--dry_run"]) == 2
    assert time.monotonic() - started < 2
    assert "not a regular file" in capsys.readouterr().err


def test_a_sweeps_config_is_checked_as_fit_checks_it(tmp_path, capsys):
    import yaml

    (tmp_path / "c.yaml").write_text("client: null\n")
    spec = {"name": "s", "method": "grid", "parameters": {"seed": {"values": [0]}},
            "command": ["${env}", "${interpreter}", "-m", "fdlit", "fit", "--config", "digits.yaml", "--config",
                        str(tmp_path / "c.yaml"), "${args}"]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(tmp_path / "s.yaml"), "--dry_run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: client: must be a mapping of its options"), err
