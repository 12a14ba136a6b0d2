"""The magics' help has one source, the code: ``%%traceml``'s parser and the ``%traceml`` line
commands. The README's usage block and tables are a rendering of them, and this test holds them
to it: every option of the parser has its row and its place in the usage block, and no row names
an option or a command the code does not have."""

from __future__ import annotations

import re
from pathlib import Path

from traceml_nb.notebook.line_commands import _LINE_COMMANDS, _SHELL_COMMANDS, LINE_HELP
from traceml_nb.notebook.magic import TraceMLMagics

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _section(heading: str) -> str:
    start = README.index(heading)
    end = README.find("\n### ", start + 1)
    return README[start:end]


def parser_options() -> set[str]:
    parser = TraceMLMagics.traceml_cell.parser
    return {s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")}


def test_the_cell_magic_options_table_is_the_parsers() -> None:
    section = _section("### `%%traceml` — measure a cell")
    rows = re.findall(r"^\| ((?:[^|\\]|\\.)*) \|", section, re.MULTILINE)  # a cell may hold \|
    in_table = {o for row in rows for o in re.findall(r"(--?[a-z][a-z-]*)", row)}
    assert in_table == parser_options()


def test_the_cell_magic_usage_block_names_every_option() -> None:
    usage = _section("### `%%traceml` — measure a cell").split("```")[1]
    in_usage = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage))
    assert in_usage == parser_options() - {"--out"}  # -o VAR stands for both spellings


def test_the_line_commands_table_and_help_are_the_dispatchers() -> None:
    commands = (set(_LINE_COMMANDS) | set(_SHELL_COMMANDS)) - {"help"}
    section = _section("### `%traceml` — the session history")
    assert set(re.findall(r"^\| `%traceml (\w+)", section, re.MULTILINE)) == commands
    assert set(re.findall(r"^  %traceml (\w+)", LINE_HELP, re.MULTILINE)) == commands | {"help"}
