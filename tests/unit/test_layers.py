"""The package's layers, read from its imports: data flows one way, from the instruments up to
the views, and no module imports a layer above its own (at the top of a file or inside a
function alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "traceml_nb"

#: The layers, lowest first, as the package's dotted paths (a module belongs to the longest path
#: it is under); a module may import its own layer and those below.
LAYERS: list[tuple[str, ...]] = [
    (  # shared words, tables, the environment variables
        "settings",
        "engine",
        "engine.contracts",
        "engine.capabilities",
        "engine.record",
        "engine.events",
        "engine.profile_capture",
    ),
    ("engine.segment", "engine.instrument", "engine.sampling"),  # events into rows, samples
    ("engine.run", "engine.rank_launch"),  # installs, measures, removes; its ranks
    ("analysis",),  # pure functions of a record
    ("session", "tune"),  # history, comparisons, results; measuring DataLoader settings
    ("views",),  # what the user sees
    ("notebook", "selfcheck", "demo", "api", "__init__", "__main__"),  # entry points
]
LAYER_OF = {name: depth for depth, names in enumerate(LAYERS) for name in names}


def top_part(module: str) -> str:
    """The layer path of ``traceml_nb.<path>...`` (``traceml_nb`` itself: ``__init__``): the
    longest path of :data:`LAYERS` the module is under, else its first part."""
    rel = module.split(".", 1)[1] if "." in module else "__init__"
    under = [p for p in LAYER_OF if rel == p or rel.startswith(p + ".")]
    return max(under, key=len) if under else rel.split(".")[0]


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import of ``traceml_nb`` in the file, function
    bodies included."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None:
                found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, name) for line, name in found if name.split(".")[0] == "traceml_nb"]


def upward_imports(path: Path, module: str) -> list[str]:
    """What ``module`` (at ``path``) imports from a layer above its own."""
    own = LAYER_OF[top_part(module)]
    problems = []
    for line, name in imported_modules(path, module):
        target = top_part(name)
        if target not in LAYER_OF:
            problems.append(f"{module}:{line} imports {name}, which is in no layer")
        elif LAYER_OF[target] > own:
            problems.append(
                f"{module}:{line} imports {name} (layer {target} above {top_part(module)})"
            )
    return problems


def package_modules() -> list[tuple[Path, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((path, ".".join(parts)))
    return out


def test_every_module_is_in_a_layer():
    missing = {top_part(module) for _, module in package_modules()} - set(LAYER_OF)
    assert not missing, f"put these in LAYERS: {sorted(missing)}"


def test_no_module_imports_a_layer_above_its_own():
    problems = [p for path, module in package_modules() for p in upward_imports(path, module)]
    assert problems == []


def test_the_engine_imports_nothing_of_the_session_or_the_views():
    for path, module in package_modules():
        if top_part(module).split(".")[0] in ("engine", "analysis"):
            names = [name for _, name in imported_modules(path, module)]
            above = [
                n for n in names if top_part(n).split(".")[0] in ("session", "views", "notebook")
            ]
            assert not above, module


@pytest.mark.parametrize(
    ("source", "where"),
    [
        ("from ..views.live.view import LiveView\n", "top"),
        ("def result(self):\n    from ..session import Session\n", "function"),
        ("import traceml_nb.views.report\n", "absolute"),
    ],
)
def test_the_check_fails_when_run_py_imports_upward(tmp_path, source, where):
    fake = tmp_path / "run.py"
    fake.write_text(source)
    assert upward_imports(fake, "traceml_nb.engine.run"), where


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports (at the top or in a function), each named as
    the module or package it resolves to: ``from .session import Session`` is an edge to the
    package ``traceml_nb.session`` (its ``__init__`` re-exports), ``from . import run`` to
    ``traceml_nb.engine.run``. A module's own parent packages, which Python imports before it, are
    not edges of its own."""
    modules = {module: path for path, module in package_modules()}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for _, name in imported_modules(path, module):
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()  # a name imported from a module: the module
            target = ".".join(parts)
            if target and target != module and not module.startswith(target + "."):
                edges.add(target)
        graph[module] = edges
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles_package_re_exports_included():
    assert import_circles(import_graph()) == []


def test_the_circle_check_sees_a_circle_through_a_package():
    graph = {"p": {"p.a"}, "p.a": {"q"}, "q": {"p"}, "r": {"q"}}
    assert import_circles(graph) == [["p", "p.a", "q"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def attribute_assignments(path: Path) -> list[str]:
    """``a.b = ...`` at a module's top level: a module setting another's global at import, the
    hidden wiring the import check cannot see."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        found += [f"{path.name}:{node.lineno}" for t in targets if isinstance(t, ast.Attribute)]
    return found


def test_no_module_sets_another_modules_global_at_import():
    """Dependencies are passed (a renderer to a session, a session to a run), never set from
    above into a lower module's globals."""
    assert [a for path, _ in package_modules() for a in attribute_assignments(path)] == []


def test_the_wiring_check_sees_an_assignment(tmp_path):
    fake = tmp_path / "init.py"
    fake.write_text("from . import run as _run\n_run.default_session = object\n")
    assert attribute_assignments(fake) == ["init.py:2"]


#: The most lines a module may have: past it, a module holds more than one concept.
MAX_MODULE_LINES = 500
#: The most lines of the module of ``Session``, which keeps a kernel's state and delegates.
MAX_SESSION_LINES = 300
#: Modules allowed over their limit, with their length then (none since 2026-12-03): an entry
#: may only leave this list, never join it.
OVER_THE_LIMIT: dict[str, int] = {}


def module_lines() -> dict[str, int]:
    return {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text().splitlines())
        for path, _ in package_modules()
    }


def test_no_module_grows_past_its_limit():
    limits = {"traceml_nb/session/session.py": MAX_SESSION_LINES}
    over = {}
    for name, lines in module_lines().items():
        limit = max(limits.get(name, MAX_MODULE_LINES), OVER_THE_LIMIT.get(name, 0))
        if lines > limit:
            over[name] = (lines, limit)
    assert over == {}


def test_the_list_of_modules_over_the_limit_only_holds_such_modules():
    lines = module_lines()
    limits = {"traceml_nb/session/session.py": MAX_SESSION_LINES}
    for name in OVER_THE_LIMIT:
        assert name in lines, f"{name} is gone: take it off OVER_THE_LIMIT"
        assert lines[name] > limits.get(name, MAX_MODULE_LINES), f"{name} fits: take it off"


def test_no_two_modules_share_a_name():
    """One name, one concept: ``views/check_report.py`` writes what ``session/check.py`` found."""
    names: dict[str, list[str]] = {}
    for path, module in package_modules():
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.name, []).append(module)
    assert {n: m for n, m in names.items() if len(m) > 1} == {}
