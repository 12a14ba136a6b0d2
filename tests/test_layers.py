"""The package's layers, read from its imports: data flows one way, from the instruments up to
the views, and no module imports a layer above its own (at the top of a file or inside a
function alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "traceml_nb"

#: The layers, lowest first; a module may import its own layer and those below.
LAYERS: list[tuple[str, ...]] = [
    ("contracts", "capabilities", "record", "events", "profile_capture"),  # shared words, tables
    ("segment", "instrument", "sampling"),  # what measures: events into rows, samples
    ("run", "rank_engine"),  # the engine: installs, measures, removes; its ranks
    ("analysis",),  # pure functions of a record
    ("session", "tune"),  # history, comparisons, results; measuring DataLoader settings
    ("views",),  # what the user sees
    (
        "cell",
        "magic",
        "magic_commands",
        "selfcheck",
        "demo",
        "__init__",
        "__main__",
    ),  # entry points
]
LAYER_OF = {name: depth for depth, names in enumerate(LAYERS) for name in names}


def top_part(module: str) -> str:
    """The layer name of ``traceml_nb.<part>...`` (``traceml_nb`` itself: ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


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
    engine = ("run", "record", "instrument", "sampling", "analysis", "segment", "events")
    for path, module in package_modules():
        if top_part(module) in engine:
            names = [name for _, name in imported_modules(path, module)]
            assert not [n for n in names if top_part(n) in ("session", "views", "magic")], module


@pytest.mark.parametrize(
    ("source", "where"),
    [
        ("from .views.live import LiveView\n", "top"),
        ("def result(self):\n    from .session import Session\n", "function"),
        ("import traceml_nb.views.report\n", "absolute"),
    ],
)
def test_the_check_fails_when_run_py_imports_upward(tmp_path, source, where):
    fake = tmp_path / "run.py"
    fake.write_text(source)
    assert upward_imports(fake, "traceml_nb.run"), where
