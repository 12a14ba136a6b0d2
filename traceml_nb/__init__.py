"""traceml_nb: a notebook-native performance monitor for PyTorch training.

``%load_ext traceml_nb`` then ``%%traceml`` on a training cell; or, without IPython::

    with traceml_nb.Run("baseline") as run:
        ...  # unchanged training code
    print(run.result())

IPython, torch, bokeh and the samplers are imported only when they are used, so importing
this package is cheap. ``Session`` and ``default_session`` are those of :mod:`.api` (the
session layer given the views' report), loaded when first asked for; ``Run`` is the engine's,
reporting to the kernel's session when it is given none.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .engine import run as _run
from .engine.run import RunAlreadyActiveError, active_run, step

if TYPE_CHECKING:
    from .session import Session
    from .views.check_report import CheckReport

__version__ = "0.1.0"
__all__ = [
    "Run",
    "RunAlreadyActiveError",
    "Session",
    "active_run",
    "check",
    "default_session",
    "step",
    "load_ipython_extension",
    "__version__",
]

_LAZY = ("Session", "default_session")  # the session layer loads numpy: imported when used


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'traceml_nb' has no attribute {name!r}")


class Run(_run.Run):
    """The measurement engine (:class:`traceml_nb.engine.run.Run`), as a context manager; given no
    ``session``, its :meth:`result` reports to the kernel's (:func:`default_session`)."""

    def default_session(self) -> Session:
        from .api import default_session

        return default_session()


def check(
    name: str,
    *,
    store: str | os.PathLike[str] | None = None,
    max_slowdown: float | None = None,
    against: str | int = "baseline",
    any_hardware: bool = False,
    runs: int = 1,
    baseline_runs: int | None = None,
) -> CheckReport:
    """The CI gate as an API (``python -m traceml_nb check``): the latest stored run of
    ``name`` (the latest ``runs`` of them, together) against its baseline. Returns a
    :class:`~traceml_nb.views.check_report.CheckReport`: ``exit_code`` (0 no regression, 1
    regression, 2 no baseline / unreadable store, 3 inconclusive), ``text()``, ``markdown()``,
    ``junit()``. ``max_slowdown``: a fraction (default 0.10); ``baseline_runs``: the last this
    many runs of the configuration make the baseline (default ``BASELINE_RUNS``)."""
    from .analysis.thresholds import BASELINE_RUNS, DEFAULT_MAX_SLOWDOWN
    from .session.check import check as run_check
    from .views.check_report import CheckReport

    limit = DEFAULT_MAX_SLOWDOWN if max_slowdown is None else max_slowdown
    return CheckReport(
        run_check(
            name,
            store=store,
            max_slowdown=limit,
            against=against,
            any_hardware=any_hardware,
            runs=runs,
            baseline_runs=BASELINE_RUNS if baseline_runs is None else baseline_runs,
        )
    )


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%traceml`` / ``%traceml`` (called by ``%load_ext traceml_nb``)."""
    from .notebook.magic import register

    register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .notebook.magic import unregister

    unregister(ipython)
