"""The public session, wired: the session layer given the views' report, and the kernel's one.

The layers below the views write no report: a :class:`~traceml_nb.session.session.Session` is
given a renderer and passes it on to its results (``str(result)``) and to the trackers. This
module, above them all, is where the views' :class:`~traceml_nb.views.report.ReportRenderer` is
handed down: ``traceml_nb.Session`` is :class:`Session`, and :func:`default_session` is the
kernel's (the magic's, and that of every ``traceml_nb.Run`` given no session). Importing it
loads the session layer and numpy; ``import traceml_nb`` does so only when one is asked for.
"""

from __future__ import annotations

import os

from .engine.run import Run
from .session.history import History
from .session.result import Renderer, RunResult
from .session.session import Session as _Session
from .views.report import ReportRenderer


class Session(_Session):
    """A :class:`~traceml_nb.session.session.Session` whose results print as the report and
    attach it to the trackers (``renderer``: another one; options as that class takes them),
    and which prints where each result was logged."""

    def __init__(
        self,
        history: History | None = None,
        *,
        store: str | os.PathLike[str] | bool | None = None,
        log_to: str | list[str] | bool | None = None,
        log_steps: bool = False,
        renderer: Renderer | None = None,
    ) -> None:
        super().__init__(
            history,
            store=store,
            log_to=log_to,
            log_steps=log_steps,
            renderer=renderer if renderer is not None else ReportRenderer(),
        )

    def result(self, run: Run, *, log_to: str | list[str] | bool | None = None) -> RunResult:
        """The run's result (:meth:`~traceml_nb.session.session.Session.result`), after a line
        for each tracker it was logged to (or could not be)."""
        result = super().result(run, log_to=log_to)
        for line in result.trackers:
            print(line)
        return result


_default: Session | None = None


def default_session() -> Session:
    """The session of this kernel (one per process): the magic's, and that of every
    ``traceml_nb.Run`` given no session."""
    global _default
    if _default is None:
        _default = Session()
    return _default
