"""Running a cell's code the way IPython runs a plain cell, for ``%%traceml``.

The cell runs the way ``%%time`` runs it, only closer to a normal cell: IPython's input
transforms and AST transformers, compiled by the shell's compiler under the cell's own name
(so a traceback shows ``Cell In[n], line k`` with the user's line), executed in the user
namespace, the trailing expression shown by the shell's displayhook exactly as a plain cell
would (``Out[n]``, ``_``, a trailing ``;`` silences it).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from types import CodeType
from typing import Any

from IPython.core.displayhook import DisplayHook

from .cell_definitions import CellCode, cell_code

NAME_MAX_CHARS = 60
#: What a cell with a top-level ``await`` is told: IPython runs such a cell as a coroutine on
#: the kernel's event loop, which a cell magic (ours, ``%%time``'s) cannot do from inside it.
TOP_LEVEL_AWAIT = (
    "a %%traceml cell runs as plain code, as a %%time cell does, so it cannot await at its top "
    "level; measure an async loop in a plain cell instead: "
    'with traceml_nb.Run("name") as run: ...'
)


@dataclass(frozen=True)
class CellContext:
    """Where the cell comes from: its execution count, frontend cell id and full raw text."""

    number: int
    cell_id: str | None
    raw_cell: str | None
    silent: bool = False


def cell_context(shell: Any) -> CellContext:
    """What the shell knows about the cell being executed (IPython 8+ and ipykernel 6+)."""
    exec_result = getattr(shell.displayhook, "exec_result", None)
    info = getattr(exec_result, "info", None)
    number = getattr(exec_result, "execution_count", None) or shell.execution_count
    cell_id = getattr(info, "cell_id", None) or _parent_cell_id(shell)
    return CellContext(
        number=int(number),
        cell_id=str(cell_id) if cell_id else None,
        raw_cell=getattr(info, "raw_cell", None),
        silent=bool(getattr(info, "silent", False)),
    )


def _parent_cell_id(shell: Any) -> str | None:
    """The frontend's cell id in the execute_request metadata (JupyterLab, Notebook 7, VS Code)."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    try:
        parent = kernel.get_parent("shell")
    except TypeError:  # ipykernel < 6
        parent = kernel.get_parent()
    except Exception:
        return None
    metadata = (parent or {}).get("metadata") or {}
    return metadata.get("cellId") or metadata.get("cell_id")


def default_name(cell: str, number: int) -> str:
    """The cell's leading comment (``# ResNet-18, 4 workers``), else ``cell [n]``."""
    for line in cell.splitlines():
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            label = text.lstrip("#").strip()
            if label:
                return textwrap.shorten(label, NAME_MAX_CHARS, placeholder="…")
            continue
        break
    return f"cell [{number}]"


@dataclass(frozen=True)
class CompiledCell:
    """The cell body as code objects: ``statements`` run with ``exec``, then each of
    ``displayed`` (compiled in ``'single'`` mode, so its value goes to the displayhook)."""

    statements: CodeType
    displayed: list[CodeType]
    filename: str


def _body_offset(raw_cell: str | None, body: str) -> int:
    """How many lines of the raw cell precede the body (the ``%%traceml`` line: 1), or -1."""
    if not raw_cell:
        return -1
    lines = raw_cell.splitlines(keepends=True)
    for i in range(1, min(len(lines), 4) + 1):
        if "".join(lines[i:]).rstrip("\n") == body.rstrip("\n"):
            return i
    return -1


def _split_interactive(
    nodes: list[ast.stmt], interactivity: str
) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """Which trailing nodes show their value, following IPython's ``ast_node_interactivity``."""
    if not nodes or interactivity == "none":
        return nodes, []
    if interactivity == "last_expr_or_assign":
        last = nodes[-1]
        target: ast.expr | None = None
        if isinstance(last, (ast.AugAssign, ast.AnnAssign)):
            target = last.target
        elif isinstance(last, ast.Assign) and len(last.targets) == 1:
            target = last.targets[0]
        if isinstance(target, ast.Name):
            shown = ast.Expr(ast.Name(target.id, ast.Load()))
            ast.copy_location(shown, last)
            ast.fix_missing_locations(shown)
            nodes = [*nodes, shown]
        interactivity = "last_expr"
    if interactivity == "last_expr":
        return (nodes[:-1], nodes[-1:]) if isinstance(nodes[-1], ast.Expr) else (nodes, [])
    if interactivity == "last":
        return nodes[:-1], nodes[-1:]
    if interactivity == "all":
        return [], nodes
    return nodes, []


def compile_cell(shell: Any, cell: str, context: CellContext) -> CompiledCell:
    """Transform and compile ``cell`` like IPython compiles a plain cell.

    The full raw cell (``%%traceml`` line included) is put in the line cache under the
    cell's name and the body's line numbers are shifted past the magic line, so tracebacks
    show the user's own lines with the numbers the notebook shows.
    """
    transformed = shell.transform_cell(cell)
    offset = _body_offset(context.raw_cell, cell)
    if offset >= 0 and context.raw_cell is not None:
        filename = shell.compile.cache(context.raw_cell, context.number, raw_code=context.raw_cell)
    else:
        offset = 0
        filename = shell.compile.cache(transformed, context.number, raw_code=cell)
    try:
        tree = shell.compile.ast_parse(transformed, filename=filename)
    except SyntaxError as exc:
        if exc.lineno is not None:
            exc.lineno += offset
        raise
    ast.increment_lineno(tree, offset)
    tree = shell.transform_ast(tree)
    interactivity = "none" if context.silent else shell.ast_node_interactivity
    if DisplayHook.semicolon_at_end_of_expression(transformed):
        interactivity = "none"
    statements, displayed = _split_interactive(list(tree.body), interactivity)
    try:
        return CompiledCell(
            statements=shell.compile(ast.Module(statements, type_ignores=[]), filename, "exec"),
            displayed=[
                shell.compile(ast.Interactive([node]), filename, "single") for node in displayed
            ],
            filename=filename,
        )
    except SyntaxError as exc:
        if exc.msg == "'await' outside function":
            exc.msg = f"{exc.msg}: {TOP_LEVEL_AWAIT}"
        raise


def execute(compiled: CompiledCell, namespace: dict[str, Any]) -> None:
    """Run the compiled cell in ``namespace``; the last expression goes to the displayhook."""
    __tracebackhide__ = True  # noqa: F841 (read by IPython's traceback formatter)
    exec(compiled.statements, namespace)
    for code in compiled.displayed:
        exec(code, namespace)


def code_of_cell(shell: Any, cell: str) -> CellCode | None:
    """The notebook's functions, classes and values ``cell`` uses
    (:func:`~.cell_definitions.cell_code`, over the user namespace as it is when the cell
    starts); None where they cannot be read, which is never the cell's error."""
    try:
        return cell_code(shell.transform_cell(cell), shell.user_ns)
    except Exception:
        return None
