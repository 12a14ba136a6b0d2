"""A recorded run as the tuner reads it.

The tuner is handed a run of the session's history
(:class:`~traceml_nb.session.history.RunEntry`), a layer it does not import: this is what it
reads of one, so the type checker holds both sides to it.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..analysis.findings import Summary


class RecordedRun(Protocol):
    """A run of the history: what it measured and the loaders it iterated."""

    @property
    def id(self) -> int: ...  # the history's id: 1, 2, 3…

    @property
    def label(self) -> str: ...  # ``#3 baseline`` or ``@17 baseline``

    @property
    def summary(self) -> Summary: ...

    @property
    def loaders(self) -> list[dict[str, Any]]: ...  # LoaderInfo.to_dict() each, as stored

    @property
    def environment(self) -> dict[str, Any]: ...  # capture_environment() as stored
