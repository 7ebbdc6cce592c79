"""No function of fdlit but a constructor takes more than 8 parameters: what travels together is one
typed object (a frozen dataclass), as Flower's and Lightning's interfaces do."""

from __future__ import annotations

import ast
from pathlib import Path

import fdlit

MOST = 8
CONSTRUCTORS = {"__init__", "__new__", "__post_init__"}  # a config's signature is its fields


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Named parameters, less ``self`` / ``cls`` (``*args`` and ``**kwargs`` not counted)."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len([n for n in names if n not in ("self", "cls")])


def too_many(source: str, where: str) -> list[str]:
    """Every function or method of ``source`` (nested ones too) that is not a constructor and takes more
    than ``MOST`` parameters."""
    return [f"{where}:{node.lineno} {node.name} ({parameters(node)})"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name not in CONSTRUCTORS and parameters(node) > MOST]


def test_no_function_but_a_constructor_takes_more_than_eight_parameters():
    root = Path(fdlit.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 100  # the whole package is walked
    found = [hit for f in files for hit in too_many(f.read_text(), str(f.relative_to(root.parent)))]
    assert found == []


def test_a_function_with_nine_parameters_is_found_and_a_constructor_is_not():
    nine = ", ".join(f"p{i}" for i in range(9))
    source = (f"def wide({nine}): pass\n"
              f"class C:\n    def __init__(self, {nine}): pass\n    def method(self, {nine}): pass\n"
              f"    def fine(self, *args, p0, p1, **kwargs): pass\n")
    assert [hit.split(" ")[1] for hit in too_many(source, "x.py")] == ["wide", "method"]


def public_methods(cls: type) -> list[str]:
    return sorted(n for n, v in vars(cls).items() if callable(v) and not n.startswith("_"))


def test_an_executor_back_end_implements_at_most_eight_methods_and_does_other_steps_only_by_their_names():
    """``ClientExecutor`` is what a back-end must do; every other step is a function of
    ``fdlit.execution.steps`` that an executor may do its own way only under the step's name."""
    from fdlit.deployment.executor import FlowerExecutor
    from fdlit.execution import ClientExecutor, SequentialExecutor, VectorizedExecutor, steps
    from fdlit.execution.ray_executor import RayExecutor
    from fdlit.execution.rendezvous import StackedRunExecutor

    interface = public_methods(ClientExecutor)
    assert interface == ["client_hook", "fetch_states", "predict", "push_states", "setup", "teardown", "train",
                         "unreachable"]
    for cls in (SequentialExecutor, VectorizedExecutor, RayExecutor, StackedRunExecutor, FlowerExecutor):
        extra = {n for klass in cls.__mro__ if klass is not object for n in public_methods(klass)} - set(interface)
        assert extra <= set(steps.OWN_WAYS) | {"bind", "lost_nodes", "request"}, (cls.__name__, extra)
    for step in steps.OWN_WAYS:
        if step != "secure_sum":  # an attribute the privacy layer reads, not a step
            assert callable(getattr(steps, step)), step
