"""A run's configuration: what must be the same for two runs to measure the same thing.

Runs of one configuration are the unit of run-to-run noise: their spread is the noise, and runs
of different configurations never estimate it (the difference between two DataLoader settings
is not noise). A run whose configuration changed is compared with the runs of the one before
it, and :func:`changed_parts` says what changed.

The parts (:attr:`Configuration.parts`), each a plain JSON value:

============= ===================================================================================
``name``      the run's name
``hardware``  its hardware class (``traceml_nb.session.environment.hardware_class``), given by
              the caller: the analysis layer reads no environment of its own
``code``      16 hex digits (SHA-256) of the code that ran: the cell source with trailing spaces
              and blank lines ignored (as :func:`.attribution.source_diff` ignores them); else
              the main script's source (the environment's ``script_sha``); else the git commit
              with the hash of the uncommitted diff (``git_commit``, ``git_dirty``,
              ``git_diff_sha``); else ``None``: unknown
``code_kind`` ``"cell"``, ``"script"``, ``"git"``, or ``None`` (code unknown)
``loader``    the training DataLoader's :data:`.attribution.LOADER_FIELDS` (its settings, batch
              size, dataset type and length), or ``None`` without a DataLoader
``versions``  ``torch_version``, ``cuda_version`` and ``gpu_driver`` of the environment
============= ===================================================================================

The :attr:`Configuration.key` is the first ``KEY_HEX_DIGITS`` hex digits of SHA-256 over the
parts' canonical JSON (sorted keys, no spaces, ASCII): the same in every process and on every
machine, never Python's randomised ``hash``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .attribution import LOADER_FIELDS, training_loader

#: Hex digits of SHA-256 kept in a configuration's key and in a code hash (64 bits).
KEY_HEX_DIGITS = 16
#: The environment fields that are a configuration's ``versions``.
VERSION_FIELDS = ("torch_version", "cuda_version", "gpu_driver")
#: The parts :func:`changed_parts` reports, in its order.
CHANGE_PARTS = ("code", "loader", "versions", "hardware")


@dataclass(frozen=True)
class Configuration:
    """A run's configuration: its ``key`` and the ``parts`` it was computed from (see the
    module docstring). Equal keys are one configuration."""

    key: str  #: KEY_HEX_DIGITS hex digits
    parts: dict[str, Any]  #: name, hardware, code, code_kind, loader, versions

    def __hash__(self) -> int:
        return hash(self.key)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:KEY_HEX_DIGITS]


def normalised_source(source: str) -> str:
    """The cell source with trailing spaces and blank lines dropped (its lines joined by
    ``\\n``): whitespace-only edits leave the code the same."""
    return "\n".join(line.rstrip() for line in source.splitlines() if line.strip())


def code_of(
    source: str | None, environment: Mapping[str, Any] | None
) -> tuple[str | None, str | None]:
    """``(code, code_kind)`` of a run: the cell's (its source and the hashes of the notebook's
    functions and classes it uses, ``cell_definitions``), else the script's, else git's, else
    ``(None, None)``. A dirty git tree whose diff was not hashed (runs stored before
    ``git_diff_sha`` existed, or git timed out) is unknown code, not its commit's."""
    env = environment or {}
    if source is not None:
        text = normalised_source(source)
        definitions = env.get("cell_definitions")
        if isinstance(definitions, dict) and definitions:  # the notebook code the cell runs
            text += "\n" + _canonical(definitions)
        return _sha(text), "cell"
    script = env.get("script_sha")
    if isinstance(script, str) and script:
        return script, "script"
    commit = env.get("git_commit")
    if isinstance(commit, str) and commit:
        dirty, diff = env.get("git_dirty"), env.get("git_diff_sha")
        if dirty is False:
            return _sha(commit), "git"
        if dirty is True and isinstance(diff, str) and diff:
            return _sha(f"{commit}+{diff}"), "git"
    return None, None


def _loader_part(loaders: Sequence[Mapping[str, Any]] | None) -> dict[str, Any] | None:
    info = training_loader(list(loaders or ()))
    if info is None:
        return None
    return {field: info.get(field) for field in LOADER_FIELDS}


def _canonical(parts: Mapping[str, Any]) -> str:
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def configuration_of(
    name: str,
    source: str | None,
    loaders: Sequence[Mapping[str, Any]] | None,
    environment: Mapping[str, Any] | None,
    hardware: str,
) -> Configuration:
    """The configuration of a run named ``name`` with the cell ``source`` (``None``: not a
    cell), its loaders (``LoaderInfo.to_dict()`` each), its environment (``{}`` or ``None``
    when not captured) and its hardware class."""
    env = environment or {}
    code, kind = code_of(source, env)
    parts: dict[str, Any] = {
        "name": name,
        "hardware": hardware,
        "code": code,
        "code_kind": kind,
        "loader": _loader_part(loaders),
        "versions": {field: env.get(field) for field in VERSION_FIELDS},
    }
    # the parts as JSON reads them back (a tuple is a list), so a stored run's key is the same
    parts = json.loads(_canonical(parts))
    return Configuration(key=_sha(_canonical(parts)), parts=parts)


def changed_parts(before: Configuration, after: Configuration) -> tuple[str, ...]:
    """What differs from ``before`` to ``after``, as codes of :data:`CHANGE_PARTS` in that
    order: ``"code"`` (also when the code is known on one side only: the runs cannot be shown
    to run the same code), ``"loader"``, ``"versions"``, ``"hardware"``. The name is not
    among them (runs of two names are two cells). ``()`` when the keys are equal."""
    if before.key == after.key:
        return ()
    a, b = before.parts, after.parts
    changed = []
    if (a.get("code"), a.get("code_kind")) != (b.get("code"), b.get("code_kind")):
        changed.append("code")
    for part in CHANGE_PARTS[1:]:
        if a.get(part) != b.get(part):
            changed.append(part)
    return tuple(changed)
