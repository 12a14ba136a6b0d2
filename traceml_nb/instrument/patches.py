"""The only two places where we touch torch, installed for one run and always removed.

* ``_BaseDataLoaderIter.__next__`` is wrapped; the wrapper hands each fetch to the active
  :class:`~traceml_nb.instrument.tracer.StepTracer`, or calls straight through when no run is
  active (so a wrapper that user code stacked on top of ours stays harmless after the run).
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


def _make_wrapper(original: Any) -> Any:
    def __next__(self: Any) -> Any:
        tracer = _tracer
        if tracer is None or _wrapper is not __next__:  # inert once its run has ended
            return original(self)
        return tracer.fetch(self, original)

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    __next__.__qualname__ = original.__qualname__
    __next__.__doc__ = original.__doc__
    __next__._traceml_nb = True  # type: ignore[attr-defined]
    return __next__


def install(tracer: StepTracer) -> list[str]:
    """Start feeding ``tracer``; returns notes about anything unusual (e.g. a foreign wrapper)."""
    global _tracer, _original_next, _wrapper, _hook_handle
    notes: list[str] = []
    cls = _iter_class()
    _original_next = cls.__dict__["__next__"]
    _wrapper = _make_wrapper(_original_next)
    cls.__next__ = _wrapper
    import torch.optim.optimizer as optim_mod

    _hook_handle = optim_mod.register_optimizer_step_post_hook(tracer.optimizer_step)
    _tracer = tracer
    return notes


def uninstall() -> list[str]:
    """Stop feeding the tracer and put back what was there. Safe to call twice."""
    global _tracer, _original_next, _wrapper, _hook_handle
    notes: list[str] = []
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
