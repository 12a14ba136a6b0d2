"""The user docs name constants instead of copying them, and where they give a constant's value
it is the code's: every `` `NAME` = value `` (or `` `NAME` (value `` ) in README.md and docs/*.md
is checked against the module-level assignment of that name in the package, read from the
source (ast), and every other all-caps name in backticks must be a constant of the package or a
string its code reads (an environment variable).

benchmarks/README.md is left out on purpose: its tables are dated records of what was measured
with the constants of that day.

Values are read as the docs write them: ``8%`` is 0.08 (a ``*_PCT`` constant holds percent:
``85%`` is 85), ``15 points`` is 0.15 (a ``*_POINTS`` constant holds points), ``1 − `NAME` =
99.9%`` is 1 − 0.001, ``half`` is 0.5; ``×``, ``s`` and ``th`` are units; the code's value is
rounded to the decimals the doc gives.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "traceml_nb"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: Variables the docs tell users to set that a third-party library reads, not this package.
THIRD_PARTY_VARIABLES = {"WANDB_MODE", "WANDB_PROJECT"}

_NAMED_VALUE = re.compile(
    r"`(?P<name>[A-Z][A-Z0-9_]{2,})`(?: = | \()\**(?P<value>half|[0-9]+(?:\.[0-9]+)?)"
    r"(?P<unit>%|×|th| s\b| points| percentage points)?"
)
_NAMED = re.compile(r"`([A-Z][A-Z0-9]*_[A-Z0-9_]+)`")


@functools.cache
def package_constants() -> dict[str, list[tuple[str, object]]]:
    """Every module-level ALL_CAPS assignment of the package: name → [(module, literal value)]
    (a value that is not a literal is kept as its source text)."""
    found: dict[str, list[tuple[str, object]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id] if node.value is not None else []
            else:
                continue
            for name in names:
                if name.isupper():
                    try:
                        value = ast.literal_eval(node.value)
                    except ValueError:
                        value = ast.get_source_segment(source, node.value)
                    found.setdefault(name, []).append((str(path.relative_to(REPO)), value))
    return found


def package_strings() -> set[str]:
    """Every string literal in the package's code."""
    strings: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    return strings


def doc_values() -> list[tuple[str, str, str, bool]]:
    """(doc, name, the value as written, whether the doc writes ``1 − `NAME```)."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in _NAMED_VALUE.finditer(text):
            complement = text[max(0, m.start() - 4) : m.start()] == "1 \u2212 " and (
                " = " in m.group(0)
            )
            out.append((doc.name, m.group("name"), m.group(0), complement))
    return out


def as_written(name: str, written: str, code: float, complement: bool) -> tuple[float, float]:
    """The doc's number and the code's value in the doc's unit, rounded as the doc writes it."""
    m = _NAMED_VALUE.match(written)
    assert m is not None
    text, unit = m.group("value"), (m.group("unit") or "").strip()
    number = 0.5 if text == "half" else float(text)
    value = 1 - code if complement else code
    if unit == "%" and not name.endswith("_PCT"):
        value *= 100
    if unit in ("points", "percentage points") and not name.endswith("_POINTS"):
        value *= 100
    decimals = len(text.split(".")[1]) if "." in text else (1 if text == "half" else 0)
    return number, round(value, decimals)


def test_the_docs_name_constants_at_all():
    """The pattern finds what it is meant to (a rename of the docs' form would empty it)."""
    assert len(doc_values()) >= 40


@pytest.mark.parametrize(
    ("doc", "name", "written", "complement"), doc_values(), ids=lambda v: str(v)[:40]
)
def test_a_constant_a_doc_gives_has_that_value_in_the_code(doc, name, written, complement):
    definitions = package_constants().get(name)
    assert definitions, f"{doc} gives {written!r}, but the package defines no {name}"
    values = {repr(v) for _, v in definitions}
    assert len(values) == 1, f"{name} has different values in {definitions}"
    code = definitions[0][1]
    if isinstance(code, tuple | list):
        code = code[0]
    assert isinstance(code, int | float), f"{name} = {code!r} is not a number ({doc})"
    number, value = as_written(name, written, float(code), complement)
    assert number == value, f"{doc} gives {written!r}; {definitions[0][0]} has {name} = {code!r}"


def test_every_name_in_backticks_is_a_constant_or_a_variable_the_code_reads():
    constants, strings = package_constants(), package_strings()
    unknown = sorted(
        {
            (doc.name, name)
            for doc in DOCS
            for name in _NAMED.findall(doc.read_text())
            if name not in constants and name not in strings and name not in THIRD_PARTY_VARIABLES
        }
    )
    assert not unknown, f"named in the docs, unknown to the code: {unknown}"


def test_the_reading_of_values_both_ways():
    """``8%`` is 0.08 and not 0.8; a *_PCT constant holds percent; ``1 −`` and ``points``."""
    assert as_written("X_SHARE", "`X_SHARE` = 8%", 0.08, False) == (8.0, 8.0)
    assert as_written("X_SHARE", "`X_SHARE` = 8%", 0.8, False) != (8.0, 8.0)
    assert as_written("X_PCT", "`X_PCT` = **85%**", 85.0, False) == (85.0, 85.0)
    assert as_written("X_PCT", "`X_PCT` = **85%**", 0.85, False) != (85.0, 85.0)
    assert as_written("X_LOOK", "`X_LOOK` = **99.9%**", 0.001, True) == (99.9, 99.9)
    assert as_written("X_SHARE", "`X_SHARE` = 15 points", 0.15, False) == (15.0, 15.0)
    assert as_written("X_POINTS", "`X_POINTS` = **2** percentage points", 2.0, False) == (2, 2)
    assert as_written("X_SHARE", "`X_SHARE` = half of", 0.5, False) == (0.5, 0.5)
    assert as_written("X_S", "`X_S` (30 s,", 30.0, False) == (30.0, 30.0)
