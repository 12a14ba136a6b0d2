"""The history's JSON file: ``%traceml save PATH`` writes it, ``%traceml load PATH`` reads it.

Writing is atomic (a crash mid-save leaves the old file). Reading checks the whole file before
anything is replaced, and never unpickles or evaluates anything: a file that is not ours, is
corrupt or is of another version raises :class:`HistoryFileError` naming what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

FILE_FORMAT = "traceml_nb.history"
FILE_VERSION = 1


class _Identified(Protocol):
    @property
    def id(self) -> int: ...


_Entry = TypeVar("_Entry", bound=_Identified)


class HistoryFileError(ValueError):
    """A history file that cannot be loaded (corrupt, not ours, or another version)."""


def write_history_file(path: str | os.PathLike[str], data: dict[str, Any]) -> str:
    """Write ``data`` (``History.to_dict()``) to ``path`` as JSON, atomically; returns the
    absolute path written."""
    target = os.path.abspath(os.fspath(path))
    fd, tmp = tempfile.mkstemp(
        prefix=".traceml-history-", suffix=".tmp", dir=os.path.dirname(target)
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(_finite(data), fh, allow_nan=False, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def _finite(value: Any) -> Any:
    """``value`` with every NaN/infinity replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read_history_file(
    path: str | os.PathLike[str], entry_of: Callable[[Any], _Entry]
) -> tuple[list[_Entry], int]:
    """The runs in a history file, each made by ``entry_of`` from its JSON object (a
    ``ValueError`` of it names the run), and the next id; or :class:`HistoryFileError`."""
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise HistoryFileError(f"cannot read history file {where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise HistoryFileError(
            f"{where} is not a traceml_nb history file (not UTF-8 text)"
        ) from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise HistoryFileError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise HistoryFileError(
            f'{where} is not a traceml_nb history file (no "format": "{FILE_FORMAT}")'
        )
    version = data.get("version")
    if version != FILE_VERSION:
        raise HistoryFileError(
            f"{where} is a traceml_nb history of version {version!r}; this traceml_nb reads version {FILE_VERSION}"
        )
    runs = data.get("runs")
    if not isinstance(runs, list):
        raise HistoryFileError(f"{where}: 'runs' must be a list")
    entries = []
    for position, item in enumerate(runs, 1):
        try:
            entries.append(entry_of(item))
        except ValueError as exc:
            raise HistoryFileError(f"{where}: run {position} of {len(runs)}: {exc}") from None
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids) or ids != sorted(ids):
        raise HistoryFileError(f"{where}: run ids must be unique and increasing")
    next_id = data.get("next_id")
    if not (isinstance(next_id, int) and not isinstance(next_id, bool)) or next_id <= max(
        ids, default=0
    ):
        raise HistoryFileError(f"{where}: 'next_id' must be an integer above every run id")
    return entries, next_id


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a history file")
