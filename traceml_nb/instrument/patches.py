"""The only two places where we touch torch, installed for one run and always removed.

* ``_BaseDataLoaderIter.__next__`` is replaced by the run's wrapper
  (:meth:`~traceml_nb.instrument.tracer.StepTracer.wrap_next`), which calls straight through
  once its run has ended (so a wrapper that user code stacked on top of ours stays harmless).
* a global optimizer post-step hook (``register_optimizer_step_post_hook``).
"""

from __future__ import annotations

from typing import Any

from .tracer import StepTracer

_tracer: StepTracer | None = None
_original_next: Any = None
_wrapper: Any = None
_hook_handle: Any = None


def _iter_class() -> Any:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter


def install(tracer: StepTracer) -> list[str]:
    """Start feeding ``tracer``; returns notes about anything unusual (e.g. a foreign wrapper)."""
    global _tracer, _original_next, _wrapper, _hook_handle
    notes: list[str] = []
    cls = _iter_class()
    _original_next = cls.__dict__["__next__"]
    _wrapper = tracer.wrap_next(_original_next)
    cls.__next__ = _wrapper
    import torch.optim.optimizer as optim_mod

    _hook_handle = optim_mod.register_optimizer_step_post_hook(tracer.optimizer_step)
    _tracer = tracer
    return notes


def uninstall() -> list[str]:
    """Stop feeding the tracer and put back what was there. Safe to call twice."""
    global _tracer, _original_next, _wrapper, _hook_handle
    notes: list[str] = []
    if _tracer is not None:
        _tracer.active = False  # the wrapper calls through from now on, wherever it is
    _tracer = None
    if _hook_handle is not None:
        _hook_handle.remove()
        _hook_handle = None
    if _wrapper is not None:
        cls = _iter_class()
        if cls.__dict__.get("__next__") is _wrapper:
            cls.__next__ = _original_next
        else:
            notes.append(
                "another wrapper was installed on DataLoader iteration during the run; "
                "ours stays beneath it, inert, so theirs keeps working"
            )
        _wrapper = None
        _original_next = None
    return notes


def is_installed() -> bool:
    """True while a run's tracer is receiving events."""
    return _tracer is not None
