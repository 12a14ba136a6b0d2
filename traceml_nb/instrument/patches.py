"""The only places where we touch torch, installed for one run and always removed.

* ``_BaseDataLoaderIter.__next__`` is replaced by the run's
  (:meth:`~traceml_nb.instrument.tracer.StepTracer.wrap_next`): off CUDA, torch's own
  ``__next__`` recompiled with the fetch's timing inside it (:mod:`.recompile`), elsewhere a
  wrapper. Once its run has ended it logs nothing (so a wrapper that user code stacked on top
  of ours stays harmless).
* Optimizer steps. Every ``torch.optim.Optimizer`` calls ``self._optimizer_step_code()``, an
  empty method, right after its ``step()`` (torch's hook point for its profiler, in
  ``Optimizer.profile_hook_step``). For the run, ``Optimizer._optimizer_step_code`` is ours:
  first a function that reports each step to the tracer with its time (for the optimizer
  rows of a loop without a DataLoader); once the tracer needs only to count steps (a loader
  has closed a step), the tracer's
  :attr:`~traceml_nb.instrument.tracer.StepTracer.step_counter`, a ``functools.partial`` of
  the log's ``list.append``: from then on an optimizer step costs no Python call at all,
  where a global post-step hook would cost one. From Python 3.13 on it is installed as a
  ``staticmethod``: there a bare ``partial`` class attribute warns (``FutureWarning``) on every
  read, and from 3.14 on it binds, passing the optimizer to ``append`` (``functools.partial``
  becomes a method descriptor). Before 3.13 it is installed bare: a ``staticmethod`` costs its
  descriptor call, about 0.3 µs a step with cold caches. The counter carries the original
  method's ``__code__``, which ``torch.profiler``'s Python tracer looks up once per process
  (with ``with_stack=True``): a profile started inside a traced cell works, and later profiles
  still recognise optimizer steps. (Only if the process's first such profile starts before
  the run's first loader step, while our reporting function stands in, do later profiles keep
  that function's code and miss the optimizer steps in their Python events.) Where this
  cannot work (a torch that does not call the method, a subclass with a method of its own of
  that name) a global post-step hook (``register_optimizer_step_post_hook``) reports every
  step instead.
"""

from __future__ import annotations

import contextlib
from functools import partial
from types import CodeType, FunctionType
from typing import Any

from .tracer import StepTracer

_tracer: StepTracer | None = None
_original_next: Any = None
_wrapper: Any = None
_hook_handle: Any = None
_original_step_code: Any = None  # Optimizer._optimizer_step_code while ours is installed
_counter: Any = None  # the tracer's step_counter as the class holds it once it counts

_STEP_CODE = "_optimizer_step_code"
#: ``functools.partial`` is a descriptor (Python 3.13 on): as a class attribute it needs a
#: ``staticmethod`` around it
_PARTIAL_BINDS = hasattr(partial, "__get__")


def _iter_class() -> Any:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter


def _optimizer_class() -> Any:
    from torch.optim.optimizer import Optimizer

    return Optimizer


def _all_subclasses(cls: type) -> list[type]:
    found: list[type] = []
    todo: list[type] = [cls]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        found.extend(subs)
        todo.extend(subs)
    return found


def step_code_is_usable(optimizer_cls: Any) -> bool:
    """True if every optimizer step will call ``optimizer_cls._optimizer_step_code``: torch's
    step wrapper calls it (read from its code, not run), it is a plain function, and no
    subclass defined so far has a method of its own by that name."""
    if not isinstance(optimizer_cls.__dict__.get(_STEP_CODE), FunctionType):
        return False
    wrap = optimizer_cls.__dict__.get("profile_hook_step")
    code = getattr(getattr(wrap, "__func__", wrap), "__code__", None)
    nested = [c for c in getattr(code, "co_consts", ()) if isinstance(c, CodeType)]
    if not any(_STEP_CODE in c.co_names for c in nested):
        return False
    return not any(_STEP_CODE in sub.__dict__ for sub in _all_subclasses(optimizer_cls))


def _optimizer_step_code(optimizer: Any) -> None:
    """Stands in for ``Optimizer._optimizer_step_code`` (an empty method) until the tracer
    only counts steps; then it hands the class attribute to the tracer's counter."""
    tracer = _tracer
    if tracer is None:
        return
    tracer.optimizer_step(optimizer)
    counter = _counter
    if counter is not None and tracer.counts_optimizer_steps_in_c:
        optimizer_cls = _optimizer_class()
        if optimizer_cls.__dict__.get(_STEP_CODE) is _optimizer_step_code:
            setattr(optimizer_cls, _STEP_CODE, counter)


def _stop_counting() -> None:
    """Put the reporting function back in place of the tracer's counter (the tracer stopped:
    the function ignores the steps, and the log stops growing)."""
    optimizer_cls = _optimizer_class()
    if _counter is not None and optimizer_cls.__dict__.get(_STEP_CODE) is _counter:
        setattr(optimizer_cls, _STEP_CODE, _optimizer_step_code)


def _dressed_as(counter: Any, original: Any) -> Any:
    """``counter`` with the name, docs and ``__code__`` of the method it stands in for."""
    for name in ("__module__", "__name__", "__qualname__", "__doc__", "__code__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(counter, name, getattr(original, name))
    counter.__wrapped__ = original
    return counter


def install(tracer: StepTracer) -> list[str]:
    """Start feeding ``tracer``; returns notes about anything unusual (e.g. a foreign wrapper)."""
    global _tracer, _original_next, _wrapper, _hook_handle, _original_step_code, _counter
    notes: list[str] = []
    cls = _iter_class()
    _original_next = cls.__dict__["__next__"]
    _wrapper = tracer.wrap_next(_original_next)
    cls.__next__ = _wrapper
    optimizer_cls = _optimizer_class()
    if step_code_is_usable(optimizer_cls):
        _original_step_code = optimizer_cls.__dict__[_STEP_CODE]
        _counter = _dressed_as(tracer.step_counter, _original_step_code)
        if _PARTIAL_BINDS:
            _counter = staticmethod(_counter)
        setattr(optimizer_cls, _STEP_CODE, _optimizer_step_code)
        tracer.on_stop = _stop_counting
    else:
        import torch.optim.optimizer as optim_mod

        _hook_handle = optim_mod.register_optimizer_step_post_hook(tracer.optimizer_step)
    _tracer = tracer
    return notes


def uninstall() -> list[str]:
    """Stop feeding the tracer and put back what was there. Safe to call twice."""
    global _tracer, _original_next, _wrapper, _hook_handle, _original_step_code, _counter
    notes: list[str] = []
    if _tracer is not None:
        _tracer.deactivate()  # the wrapper calls through from now on, wherever it is
        _tracer.on_stop = None
    _stop_counting()
    _counter = None
    _tracer = None
    if _hook_handle is not None:
        _hook_handle.remove()
        _hook_handle = None
    if _original_step_code is not None:
        optimizer_cls = _optimizer_class()
        if optimizer_cls.__dict__.get(_STEP_CODE) is _optimizer_step_code:
            setattr(optimizer_cls, _STEP_CODE, _original_step_code)
        else:
            notes.append(
                "Optimizer._optimizer_step_code was replaced by something else during the run; "
                "it is left as it is"
            )
        _original_step_code = None
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
