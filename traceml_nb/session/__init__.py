"""The runs of a kernel: the history, comparisons with earlier runs, and each run's result.

A :class:`Session` (one per kernel: :func:`default_session`; the magic holds it) turns an ended
:class:`~traceml_nb.run.Run` into its :class:`~.result.RunResult` and keeps it in the history.
"""

from __future__ import annotations

from .session import Session, default_session

__all__ = ["Session", "default_session"]
