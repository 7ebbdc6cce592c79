"""Two command-line mistakes are named for what they are: a `--config` link that leads to no file
(a loop), and a whole section given a plain value (`--federation 5`)."""

import os

import pytest

from fdlit.cli import main


def test_a_link_loop_as_config_is_named_as_a_link(tmp_path, capsys):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    os.symlink(b, a)
    os.symlink(a, b)
    assert main(["fit", "--config", str(a)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fdlit: error: config: '{a}' is a link that leads to no file (a loop of links or a missing "
                   "target)"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("section", ["federation", "data", "privacy"])
def test_a_section_given_a_plain_value_says_what_a_section_takes(section, tmp_path, capsys):
    assert main(["fit", "--config", "digits.yaml", f"--{section}", "5", "--logger.run_dir",
                 str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdlit: error: {section}: a section takes a YAML mapping"), err
    assert err[0].endswith("got '5'") and f"--{section}.<key> value" in err[0]
    assert not (tmp_path / "runs").exists()
