"""The round reads as Algorithm 1 in one module, and knows none of what the config adds to it: the
features are composed at set-up (round extras, the privacy layer, the server's side, the executor)."""

from __future__ import annotations

import ast
from pathlib import Path

import fdlit
from fdlit.federation.round import RoundExtra

ROUND = Path(fdlit.__file__).parent / "federation" / "round.py"
# words of the features a round must not name in its code (docstrings and comments aside)
FEATURES = ("privacy", "secure", "noise", "encod", "adversar", "attack", "collud", "server_model", "audit",
            "selection", "participation", "deploy", "carried", "flower")


def code_names(source: str) -> set[str]:
    """Every identifier the code uses (names, attributes, arguments, definitions), lower-cased."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name)
    return {n.lower() for n in out}


def feature_names(source: str) -> list[str]:
    return sorted(n for n in code_names(source) if any(f in n for f in FEATURES))


def test_the_round_is_one_module_of_at_most_200_lines_that_names_no_feature():
    source = ROUND.read_text()
    assert len(source.splitlines()) <= 200
    assert feature_names(source) == []
    # its order is Algorithm 1's: the client step, then the exchange's receive, aggregate and distil
    run = ast.get_source_segment(source, next(n for n in ast.walk(ast.parse(source))
                                              if isinstance(n, ast.FunctionDef) and n.name == "run"))
    calls = ["self.client_step(", "exchange.receive(", "exchange.aggregate(", "exchange.distil(", "exchange.evaluate("]
    positions = [run.index(c) for c in calls]
    assert positions == sorted(positions)


def test_a_feature_named_in_the_rounds_code_is_found():
    assert feature_names("def run(self, parts):\n    if parts.server.privacy.secure:\n        pass\n") == [
        "privacy", "secure"]
    assert feature_names('"""the privacy layer"""\n# secure\nx = 1\n') == []


def test_a_round_extra_changes_nothing_by_default():
    extra, sets = RoundExtra(), [("x", "y")]
    assert extra.private_sets(1, sets) is sets and extra.uploads(None, {1: "m"}) == {1: "m"}
    assert extra.metrics(None, None, None) == {}
