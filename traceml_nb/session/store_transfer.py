"""Moving stored runs between stores: ``python -m traceml_nb export`` writes a name's runs (or
every run) as JSON lines, ``import`` adds them to another store (a Colab Drive file to a
laptop's, one machine's to another's).

Each line is one run: ``{"format": "traceml_nb.run", "version": 1, "session": ..,
"session_run": .., "run": {..}}``, the run as the history's JSON has it. A run is told apart
in any store by its name, its start, the session that measured it and its number in that
session (:data:`~.store.RunKey`): importing keeps the ids of the target store apart from the
source's (the target numbers what it adds) and adds a run that is already there never again.
Reading checks every line before anything is written, and executes nothing (plain JSON).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .history import RunEntry
from .store import RunKey, Store

RUN_LINE_FORMAT = "traceml_nb.run"
RUN_LINE_VERSION = 1


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def export_lines(store: Store, name: str | None = None) -> Iterator[str]:
    """The stored runs of ``name`` (every run: None), oldest first, one JSON line each."""
    for entry, key in store.keyed_entries(name):
        # the ids of one store mean nothing in another: the run as its session numbered it
        run = {**entry.to_dict(), "id": key[3] or 1, "stored_id": None}
        line = {
            "format": RUN_LINE_FORMAT,
            "version": RUN_LINE_VERSION,
            "session": key[2],
            "session_run": key[3],
            "run": run,
        }
        yield json.dumps(_finite(line), allow_nan=False, separators=(",", ":"))


def export_to_file(store: Store, path: str, name: str | None = None) -> int:
    """Write :func:`export_lines` to ``path`` through a temporary file beside it (a failure
    leaves the file as it was); returns the runs written."""
    lines = list(export_lines(store, name))
    target = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(
        prefix=".traceml-export-", suffix=".tmp", dir=os.path.dirname(target)
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(lines)


@dataclass(frozen=True)
class Imported:
    """What an import did: ``added`` runs, ``already`` there before (left as they were)."""

    added: int
    already: int


def read_lines(lines: Iterable[str]) -> list[tuple[RunEntry, RunKey]]:
    """The runs of exported ``lines`` (blank lines skipped); ``ValueError`` naming the first
    line that is not an exported run of this version, before anything is used."""
    runs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line, parse_constant=_no_constant)
            if not isinstance(data, dict) or data.get("format") != RUN_LINE_FORMAT:
                raise ValueError("not a run exported by traceml_nb")
            if data.get("version") != RUN_LINE_VERSION:
                raise ValueError(
                    f"version {data.get('version')!r}; this traceml_nb reads {RUN_LINE_VERSION}"
                )
            session, session_run = data.get("session"), data.get("session_run")
            if session is not None and not isinstance(session, str):
                raise ValueError("'session' must be a string or null")
            if session_run is not None and not isinstance(session_run, int):
                raise ValueError("'session_run' must be an integer or null")
            if not isinstance(data.get("run"), dict):
                raise ValueError("'run' must be an object")
            entry = RunEntry.from_dict(data["run"])
        except ValueError as exc:  # json.JSONDecodeError is one
            raise ValueError(f"line {number}: {exc}") from None
        entry.session_id = session
        runs.append((entry, (entry.name, entry.started_at, session, session_run)))
    return runs


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON has")


def import_lines(store: Store, lines: Iterable[str]) -> Imported:
    """Add the runs of exported ``lines`` to ``store``, each once (module docstring)."""
    added, already = store.add_new(read_lines(lines))
    return Imported(added, already)
