"""traceml_nb: a notebook-native performance monitor for PyTorch training.

``%load_ext traceml_nb`` then ``%%traceml`` on a training cell; or, without IPython::

    with traceml_nb.Run("baseline") as run:
        ...  # unchanged training code
    print(run.result())

IPython, torch, bokeh and the samplers are imported only when they are used, so importing
this package is cheap. This module wires the layers together: a ``Run`` given no session
reports to the kernel's default :class:`Session`.
"""

from __future__ import annotations

from typing import Any

from . import run as _run
from .run import Run, RunAlreadyActiveError, active_run, step

__version__ = "0.1.0"
__all__ = [
    "Run",
    "RunAlreadyActiveError",
    "Session",
    "active_run",
    "default_session",
    "step",
    "load_ipython_extension",
    "__version__",
]

_LAZY = ("Session", "default_session")  # the session layer loads numpy: imported when used


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module 'traceml_nb' has no attribute {name!r}")


def _default_session() -> Any:
    from .session import default_session

    return default_session()


_run.default_session = _default_session


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%traceml`` / ``%traceml`` (called by ``%load_ext traceml_nb``)."""
    from .magic import register

    register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .magic import unregister

    unregister(ipython)
