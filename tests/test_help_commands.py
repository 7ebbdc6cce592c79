"""``fdlit --help`` lists every command ``main`` dispatches, whether jsonargparse parses it or its own module."""

import ast
import inspect

import pytest

from fdlit import cli


def dispatched_commands() -> set[str]:
    """The command names ``main`` compares with: ``argv[:1] == ["x"]``, ``argv[:1] in (["x"], ...)`` and
    ``cfg.command == "x"``."""
    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(cli.main))):
        if not isinstance(node, ast.Compare):
            continue
        left = ast.unparse(node.left)
        for right in node.comparators:
            if left == "argv[:1]":
                lists = right.elts if isinstance(right, ast.Tuple) else [right]
                found |= {e.elts[0].value for e in lists if isinstance(e, ast.List)}
            elif left == "cfg.command" and isinstance(right, ast.Constant):
                found.add(right.value)
    return found


def test_help_lists_every_command_main_runs(capsys):
    commands = dispatched_commands()
    assert {"fit", "sweep", "report", "export", "deploy", "data"} <= commands  # the walk finds them
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    listed = capsys.readouterr().out.split("Available subcommands:", 1)[1]
    described = {line.split()[0] for line in listed.splitlines() if line.startswith("    ") and line.split()}
    assert commands <= described, commands - described
