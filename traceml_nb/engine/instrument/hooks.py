"""The only places where a run touches torch, installed for the run and always removed.

* ``_BaseDataLoaderIter.__next__``, the method every DataLoader iterator's ``next()`` runs, is
  replaced by the tracer's wrapper (:meth:`~.tracer.StepTracer.wrap_next`).
* A global optimizer post-step hook (``torch.optim.optimizer.register_optimizer_step_post_hook``)
  reports every ``optimizer.step()``, fastai's own optimizers' too (:mod:`.optimizer_hooks`).
* The phase instruments (:mod:`.step_phases`; on CUDA with an event at each boundary), on a
  sample of the steps: module forward hooks (global ones until the model is found, then the
  model's own), a wrapper of ``torch.autograd.backward`` and a global optimizer pre-step hook;
  the tracer's post-step hook ends their optimizer phase.

With a profile window (``%%traceml --profile N``, :mod:`.profiler`), the fetch's wrapper and
one more optimizer post-step hook tell the window of each step boundary until the window has
closed; from then on the wrapper is the plain one again.

When the run ends everything is put back. If something else wrapped ``__next__`` on top of ours
during the run, ours stays beneath it and theirs keeps working; what ours still logs is
dropped. A process forked while they are in place takes its copy of them away at once, and
leaves the FLOP count and the profile window it inherited (:func:`_uninstall_in_forked_child`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..events import PHASE_NAMES, EventLike
from .flop_count import FlopWindow
from .optimizer_hooks import register_post, unwrap_foreign, wrap_foreign
from .profiler import ProfileWindow
from .step_phases import StepPhases
from .tracer import READER_MAX_EVENTS, OptimizerHook, StepTracer


@dataclass
class _Installed:
    tracer: StepTracer
    original_next: Any
    wrapper: Any  #: the tracer's wrapper
    hook: OptimizerHook  #: the tracer's optimizer post-step hook
    hook_handle: Any
    phases: StepPhases
    #: the wrapper installed on top of the tracer's while a profile window counts (else None)
    gate: Any = None
    window_handle: Any = None
    flops: FlopWindow | None = None  #: the FLOP count, which a forked child leaves
    window: ProfileWindow | None = None  #: the profile window, which a forked child leaves


@dataclass
class _Paused:
    """What ``uninstall(pause=True)`` keeps of a tracer's hooks for its next ``install``: the
    phase instruments, and the optimizer hook, whose countdown to its listeners goes on."""

    tracer: StepTracer
    phases: StepPhases
    hook: OptimizerHook


_installed: _Installed | None = None
_paused: _Paused | None = None
_fork_callback_registered = False


def _iter_class() -> Any:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter


def install(
    tracer: StepTracer, window: ProfileWindow | None = None, flops: FlopWindow | None = None
) -> None:
    """Start feeding ``tracer`` (and ``window``, while it is not done; ``flops``, which counts
    one step's FLOPs). After ``uninstall(pause=True)`` of the same tracer, its phase
    instruments and optimizer hook resume (``flops`` is then the first install's)."""
    global _installed, _paused, _fork_callback_registered
    if not _fork_callback_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_uninstall_in_forked_child)
        _fork_callback_registered = True
    cls = _iter_class()
    original = cls.__dict__["__next__"]
    wrapper = tracer.wrap_next(original)
    kept, _paused = _paused, None
    if kept is not None and kept.tracer is not tracer:
        kept.phases.remove()
        kept = None
    if kept is not None:
        phases, hook = kept.phases, kept.hook
    else:  # on CUDA with an event at each phase boundary, for the phases' GPU time
        phases = StepPhases(
            tracer.log, tracer.clock, tracer.check, READER_MAX_EVENTS, _phase_mark(tracer)
        )
        hook = tracer.optimizer_hook([x for x in (phases, flops) if x is not None])
    tracer.models_training = phases.models_training
    if flops is not None:
        flops.sizes = phases.sizes
    phases.install()
    handle = register_post(hook)
    wrap_foreign()
    tracer.on_epoch = _at_each_epoch(hook, flops)

    def stop() -> None:  # tracing stopped on an error: no more optimizer steps, no phases
        handle.remove()
        phases.remove()

    tracer.on_stop = stop
    installed = _Installed(
        tracer, original, wrapper, hook, handle, phases, flops=flops, window=window
    )
    if window is not None:
        installed.gate = _gate(window, wrapper, installed)
        installed.window_handle = register_post(_window_hook(window, installed))
    cls.__next__ = installed.gate or wrapper
    _installed = installed


def _at_each_epoch(hook: OptimizerHook, flops: FlopWindow | None) -> Callable[[], None]:
    """What each epoch's first fetch does: wrap an optimizer imported since, and have the FLOP
    count look at the trained parameters at the next optimizer step (a loop unfreezes its
    model between two epochs, fastai's ``fine_tune`` between two fits)."""

    def epoch_began() -> None:
        wrap_foreign()
        if flops is not None and flops.look_at_next_step():
            hook.look_soon()  # type: ignore[attr-defined]

    return epoch_began


def _phase_mark(tracer: StepTracer) -> Callable[[], EventLike | None] | None:
    """What records a phase boundary's CUDA event (None off CUDA): the stall timer's ``mark``,
    recording nothing while the current stream captures a CUDA graph (a timing event cannot be
    captured, and a failed call would break the user's capture)."""
    gpu = tracer.gpu
    if gpu is None:
        return None
    try:
        import torch

        capturing = torch.cuda.is_current_stream_capturing
        capturing()
    except Exception:  # a CPU build of torch (the tests' simulated GPU): nothing captures
        return gpu.mark
    mark = gpu.mark

    def mark_unless_capturing() -> EventLike | None:
        return None if capturing() else mark()

    return mark_unless_capturing


def _gate(window: ProfileWindow, wrapper: Any, installed: _Installed) -> Any:
    """The tracer's ``wrapper`` with the window told of each fetch first; once the window is
    done it puts the plain wrapper back in its place."""

    def __next__(it: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841
        _tell(window, installed, "fetch")
        return wrapper(it)

    __next__.__wrapped__ = wrapper  # type: ignore[attr-defined]
    __next__.__qualname__ = wrapper.__qualname__
    __next__.__doc__ = wrapper.__doc__
    return __next__


def _window_hook(window: ProfileWindow, installed: _Installed) -> Any:
    def on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        _tell(window, installed, "optimizer")

    return on_optimizer_step


def _tell(window: ProfileWindow, installed: _Installed | None, kind: str) -> None:
    """A step boundary of ``kind`` for the window while it counts; once it is done, the gate
    and the window's hook are taken away."""
    if not window.done:
        window.boundary(kind)
        if window.done and installed is not None:
            _close_window(installed)


def _close_window(installed: _Installed) -> None:
    """The window is done: the fetch is the tracer's plain wrapper again, the hook removed."""
    cls = _iter_class()
    if installed.gate is not None and cls.__dict__.get("__next__") is installed.gate:
        cls.__next__ = installed.wrapper
    if installed.window_handle is not None:
        installed.window_handle.remove()
        installed.window_handle = None


def marker(window: ProfileWindow | None) -> None:
    """A ``traceml_nb.step()`` marker, for the window while it counts."""
    if window is not None:
        _tell(window, _installed, "marker")


def uninstall(pause: bool = False) -> list[str]:
    """Stop feeding the tracer and put back what was there. Safe to call twice. With ``pause``
    the phase instruments keep the models found and where their sampling stands, and the
    tracer's next :func:`install` resumes them (the benchmarks' traced blocks, which stand for
    one long run); without it, whatever a pause kept is dropped too."""
    global _installed, _paused
    installed, _installed = _installed, None
    if not pause and _paused is not None:
        _paused.phases.remove()
        _paused = None
    if installed is None:
        return []
    notes = list(installed.phases.notes)
    installed.tracer.deactivate()  # what the wrapper still logs is dropped, wherever it is
    installed.tracer.on_stop = None
    installed.tracer.on_epoch = None
    installed.hook_handle.remove()
    unwrap_foreign()
    if pause:
        installed.phases.pause()
        _paused = _Paused(installed.tracer, installed.phases, installed.hook)
    else:
        installed.phases.remove()
    if installed.window_handle is not None:
        installed.window_handle.remove()
    cls = _iter_class()
    if cls.__dict__.get("__next__") in (installed.wrapper, installed.gate):
        cls.__next__ = installed.original_next
    else:
        notes.append(
            "another wrapper was installed on DataLoader iteration during the run; "
            "ours stays beneath it, inert, so theirs keeps working"
        )
    return notes


def _uninstall_in_forked_child() -> None:
    """In a process forked while a run's hooks are in place, the first thing it does: take its
    copy of them away. A DataLoader's workers are forked when the loop first iterates the
    loader, before the first optimizer step, while global module hooks still seek the model:
    each worker would run them for every module its dataset calls (a torchvision transform is
    one; 0.8 -> 3.2 us a call on the 2-core VM), for as long as it lives (with
    ``persistent_workers``, past the run). A forked rank starts a run of its own after this.

    A worker forked while a step's FLOPs are counted (an evaluation's loader iterated right
    after the first optimizer step, an epoch that begins in the counted step) would also run
    every operator of its dataset through the counter, its copy of the forking thread's
    dispatch mode, and one forked while ``--profile`` profiles would record them and trace
    the cell's lines: it leaves both (:meth:`~.flop_count.FlopWindow.leave`,
    :meth:`~.profiler.ProfileWindow.leave`)."""
    try:
        if _installed is not None and _installed.flops is not None:
            _installed.flops.leave()
        if _installed is not None and _installed.window is not None:
            _installed.window.leave()
    finally:
        if _installed is not None or _paused is not None:
            uninstall()


def is_installed() -> bool:
    """True while a run's tracer is receiving events."""
    return _installed is not None


def phases_inside() -> tuple[tuple[str, str], ...]:
    """``(outer, inner)`` phase names of each phase the installed run's instruments saw start
    inside another (``RunRecord.phases_inside``); () when none is installed."""
    if _installed is None:
        return ()
    inside = _installed.phases.clock.inside
    return tuple(sorted((PHASE_NAMES[outer], PHASE_NAMES[inner]) for outer, inner in inside))
