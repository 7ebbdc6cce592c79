"""The layout is the architecture: packages import only the layers below them, no import cycles inside
fdlit, and methods never reach the loop."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fdlit"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every fdlit module -> the fdlit modules it imports anywhere (top level, in functions, or under
    TYPE_CHECKING). ``from fdlit.a import b`` is an edge to ``fdlit.a.b`` when that is a module."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert "fdlit.federation" in graph["fdlit.runs.experiment"]
    assert "fdlit.methods.base" in graph["fdlit.execution.executor"]


def test_no_import_cycles_inside_fdlit():
    assert cycles(import_graph()) == []


def test_a_cycle_is_found_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_methods_never_import_the_loop_or_execution_or_runs():
    graph = import_graph()
    for name, edges in graph.items():
        if name.startswith("fdlit.methods"):
            bad = {e for e in edges if e.split(".")[:2] in (["fdlit", "federation"], ["fdlit", "execution"],
                                                          ["fdlit", "runs"], ["fdlit", "cli"])}
            assert not bad, f"{name} imports {bad}"
            source = (PACKAGE / Path(*name.split(".")[1:])).with_suffix(".py")
            source = source if source.exists() else source.with_suffix("") / "__init__.py"
            text = source.read_text()
            assert not re.search(r"FederationLoop|\bloop\.[a-z_]", text), name  # nor receives it


# docs/design.md's layers, lowest first: a package imports only packages of layers below its own. The
# configuration package spans layers (bounded YAML at the bottom, the fit schema above the round), so each
# of its modules has its own layer, and imports between them are checked too.
LAYERS = [
    {"fdlit", "fdlit.errors", "fdlit.messages", "fdlit.internals", "fdlit.configuration"},
    {"fdlit.configuration.bounded_yaml", "fdlit.extras"},
    {"fdlit.configuration.constructible", "fdlit.configuration.former_names"},
    {"fdlit.configuration.files", "fdlit.configuration.ranges", "fdlit.configuration.run_settings", "fdlit.data",
     "fdlit.models", "fdlit.privacy"},
    {"fdlit.configuration.code_allowlist"},
    {"fdlit.clients"},
    {"fdlit.methods"},
    {"fdlit.adversaries"},
    {"fdlit.execution"},
    {"fdlit.callbacks"},
    {"fdlit.federation"},
    {"fdlit.configuration.schema"},
    {"fdlit.runs"},
    {"fdlit.reporting", "fdlit.deployment", "fdlit.sweeps"},
    {"fdlit.cli"},
    {"fdlit.__main__"},
]


def layer_of(module: str, level: dict[str, int]) -> str:
    """The name ``module`` is layered under: itself where a layer names it (a configuration module),
    else its package (``fdlit.runs.experiment`` -> ``fdlit.runs``)."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in level:
            return ".".join(parts[:n])
    return ".".join(parts[:2])


def layer_violations(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    level = {pkg: i for i, layer in enumerate(layers) for pkg in layer}
    out = []
    for module, edges in graph.items():
        own = layer_of(module, level)
        if own not in level:
            out.append(f"{own} is in no layer")
            continue
        for edge in edges:
            other = layer_of(edge, level)
            if other != own and other != "fdlit" and level.get(other, len(layers)) >= level[own]:
                out.append(f"{module} imports {edge}")
    return sorted(set(out))


def test_every_package_imports_only_the_layers_below_it():
    assert layer_violations(import_graph(), LAYERS) == []


def test_a_layer_violation_is_found_when_there_is_one():
    layers = [{"fdlit.errors", "fdlit.configuration"}, {"fdlit.configuration.files"}, {"fdlit.data"}, {"fdlit.runs"},
              {"fdlit.configuration.schema"}]
    graph = {"fdlit.runs.experiment": {"fdlit.configuration.schema"},
             "fdlit.configuration.schema": {"fdlit.runs.checkpoint", "fdlit.errors", "fdlit.configuration.files"},
             "fdlit.configuration.files": {"fdlit.configuration.schema"},  # within the package, a layer up
             "fdlit.data.x": {"fdlit.errors", "fdlit.configuration.files"}, "fdlit.new.y": set()}
    assert layer_violations(graph, layers) == ["fdlit.configuration.files imports fdlit.configuration.schema",
                                               "fdlit.new is in no layer",
                                               "fdlit.runs.experiment imports fdlit.configuration.schema"]


def test_the_package_top_shows_its_layers_not_loose_modules():
    # configuration and sweeps are packages; what is left at the top is the vocabulary, the observers and
    # the command line
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 8, loose
    assert {"configuration", "sweeps"} <= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


METHOD_NAMES = {"method", "part", "aggregator", "rule", "inner", "method_part"}


def read_by_name(node: ast.expr) -> bool:
    """Whether ``node`` names a method or its part (``method``, ``self.method_part``, ...)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name in METHOD_NAMES


def test_the_framework_reads_a_method_by_plain_attributes_its_base_classes_declare():
    # docs/extending.md, "The contract": every attribute the framework reads is on the base class
    from fdlit.clients.method_part import MethodPart
    from fdlit.methods.base import Aggregator, ClientPart
    from fdlit.privacy.release import Declaring, UploadsPart

    soft = []
    for layer in ("federation", "privacy", "adversaries", "execution", "clients"):
        for path in (PACKAGE / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                        and isinstance(node.args[1], ast.Constant) and read_by_name(node.args[0])
                        and not node.args[1].value.startswith("__")):
                    soft.append(f"{path.name}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    assert soft == []
    for protocol, base in ((Declaring, Aggregator), (MethodPart, ClientPart), (UploadsPart, ClientPart)):
        wanted = {n for n in (*protocol.__annotations__, *vars(protocol)) if not n.startswith("_")}
        assert wanted and [n for n in sorted(wanted) if not hasattr(base, n)] == [], protocol.__name__


def test_the_rounds_signatures_name_real_types_not_any():
    # a state_dict holds arbitrary checkpoint data (tensors and plain data), the one place Any is meant
    loose = []
    for path in (PACKAGE / "federation").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in ("state_dict",
                                                                                               "load_state_dict"):
                args = node.args
                hints = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg,
                                                args.kwarg) if a is not None and a.annotation is not None]
                if any("Any" in ast.unparse(h) for h in (*hints, node.returns) if h is not None):
                    loose.append(f"{path.name}:{node.lineno} {node.name}")
    assert loose == []


def test_design_md_names_every_module_of_the_round():
    # docs/design.md, "The round, module by module"
    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    listed = set(re.findall(r"^ +(\w+\.py) ", text.split("fdlit/federation/", 1)[1].split("```", 1)[0], re.M))
    actual = {p.name for p in (PACKAGE / "federation").glob("*.py")} - {"__init__.py"}
    assert listed == actual


def test_no_test_module_imports_another_test_module():
    """Shared fixtures and helpers live in conftest.py and helper modules (tests/fitting.py, deploying.py,
    sweeping.py, fake_runs.py, ...): a test module imported by another runs its tests' module set-up twice
    and ties the two files' fates together."""
    tests = Path(__file__).resolve().parent
    pattern = re.compile(r"^\s*(from|import)\s+(tests\.)?test_\w+", re.M)
    offenders = [p.name for p in sorted(tests.glob("test_*.py")) if pattern.search(p.read_text())]
    assert offenders == []


def test_no_module_is_over_400_lines():
    """One concept per module: a module past 400 lines holds two."""
    package = Path(__file__).resolve().parents[1] / "fdlit"
    long = {str(p.relative_to(package)): n for p in package.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}
