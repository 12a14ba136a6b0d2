"""The only places where a run touches torch, installed for the run and always removed.

* ``_BaseDataLoaderIter.__next__``, the method every DataLoader iterator's ``next()`` runs, is
  replaced by the tracer's wrapper (:meth:`~.tracer.StepTracer.wrap_next`).
* A global optimizer post-step hook (``torch.optim.optimizer.register_optimizer_step_post_hook``)
  reports every ``optimizer.step()``.

When the run ends both are put back. If something else wrapped ``__next__`` on top of ours
during the run, ours stays beneath it and theirs keeps working; what ours still logs is
dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .tracer import StepTracer


@dataclass
class _Installed:
    tracer: StepTracer
    original_next: Any
    wrapper: Any
    hook_handle: Any


_installed: _Installed | None = None


def _iter_class() -> Any:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter


def install(tracer: StepTracer) -> None:
    """Start feeding ``tracer``."""
    global _installed
    import torch.optim.optimizer as optim_mod

    cls = _iter_class()
    original = cls.__dict__["__next__"]
    wrapper = tracer.wrap_next(original)
    handle = optim_mod.register_optimizer_step_post_hook(tracer.optimizer_hook())
    tracer.on_stop = handle.remove  # tracing stopped on an error: no more optimizer steps
    cls.__next__ = wrapper
    _installed = _Installed(tracer, original, wrapper, handle)


def uninstall() -> list[str]:
    """Stop feeding the tracer and put back what was there. Safe to call twice."""
    global _installed
    installed, _installed = _installed, None
    if installed is None:
        return []
    notes: list[str] = []
    installed.tracer.deactivate()  # what the wrapper still logs is dropped, wherever it is
    installed.tracer.on_stop = None
    installed.hook_handle.remove()
    cls = _iter_class()
    if cls.__dict__.get("__next__") is installed.wrapper:
        cls.__next__ = installed.original_next
    else:
        notes.append(
            "another wrapper was installed on DataLoader iteration during the run; "
            "ours stays beneath it, inert, so theirs keeps working"
        )
    return notes


def is_installed() -> bool:
    """True while a run's tracer is receiving events."""
    return _installed is not None
