"""The runs of a kernel: the history, comparisons with earlier runs, and each run's result.

A :class:`Session` turns an ended :class:`~traceml_nb.engine.run.Run` into its
:class:`~.result.RunResult` and keeps it in the history. The kernel's own session, wired with
the views' report, is ``traceml_nb.default_session()`` (:mod:`traceml_nb.api`).
"""

from __future__ import annotations

from .session import Session

__all__ = ["Session"]
