"""traceml_nb: a notebook-native performance monitor for PyTorch training.

``%load_ext traceml_nb`` then ``%%traceml`` on a training cell; or, without IPython::

    with traceml_nb.Run("baseline") as run:
        ...  # unchanged training code

IPython, torch, bokeh and the samplers are imported only when they are used, so importing
this package is cheap.
"""

from __future__ import annotations

from typing import Any

from .run import Run, RunAlreadyActiveError, active_run, step

__version__ = "0.1.0"
__all__ = [
    "Run",
    "RunAlreadyActiveError",
    "active_run",
    "step",
    "load_ipython_extension",
    "__version__",
]


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%traceml`` / ``%traceml`` (called by ``%load_ext traceml_nb``)."""
    from .magic import register

    register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .magic import unregister

    unregister(ipython)
