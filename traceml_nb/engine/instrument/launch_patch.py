"""The patch that lets a run see the ranks it launches, installed for the run and always removed.

``torch.multiprocessing.start_processes`` is replaced, in the ``torch.multiprocessing``
namespace and in ``torch.multiprocessing.spawn``'s module (where ``spawn()`` looks it up), by a
function that hands every call to the run's handler with the original; the handler decides
how the ranks are started (:mod:`traceml_nb.engine.rank_launch`). ``torch.multiprocessing.spawn``,
``start_processes`` and what calls them at call time (``accelerate.notebook_launcher`` through
``torch.distributed.elastic``) all pass there. A reference to the original taken before the run
(``from torch.multiprocessing import start_processes`` at the top of a cell) is not seen.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: ``handler(original, fn, args, nprocs, join, daemon, start_method)``: what the patched
#: ``start_processes`` calls; it returns what ``original`` returns.
Handler = Callable[..., Any]


@dataclass
class _Installed:
    original: Any
    patched: Any


_installed: _Installed | None = None


def _modules() -> tuple[Any, Any]:
    import sys

    import torch.multiprocessing as tmp

    return tmp, sys.modules["torch.multiprocessing.spawn"]


def install(handler: Handler) -> None:
    """Route ``start_processes`` (and so ``spawn``) through ``handler`` until :func:`uninstall`."""
    global _installed
    namespace, spawn_module = _modules()
    original = spawn_module.__dict__["start_processes"]

    @functools.wraps(original)
    def start_processes(
        fn: Any,
        args: tuple[Any, ...] = (),
        nprocs: int = 1,
        join: bool = True,
        daemon: bool = False,
        start_method: str = "spawn",
    ) -> Any:
        __tracebackhide__ = True  # noqa: F841
        return handler(original, fn, args, nprocs, join, daemon, start_method)

    start_processes.__traceml_ranks__ = True  # type: ignore[attr-defined]
    spawn_module.start_processes = start_processes
    namespace.start_processes = start_processes
    _installed = _Installed(original, start_processes)


def uninstall() -> list[str]:
    """Put the original back where ours still is. Safe to call twice."""
    global _installed
    installed, _installed = _installed, None
    if installed is None:
        return []
    notes = []
    for module in _modules():
        if module.__dict__.get("start_processes") is installed.patched:
            module.start_processes = installed.original
        else:
            notes.append(
                f"another patch replaced {module.__name__}.start_processes during the run; "
                "it stays, ours beneath it hands the calls on unchanged"
            )
    return notes


def forget() -> None:
    """In a forked child: drop the parent's patch (the child's copy of it) without a note."""
    uninstall()


def is_installed() -> bool:
    """True while a run routes ``start_processes`` through its handler."""
    return _installed is not None


def is_patched() -> bool:
    """True when either place still holds a patched ``start_processes`` (leak checks)."""
    return any(
        getattr(module.__dict__.get("start_processes"), "__traceml_ranks__", False)
        for module in _modules()
    )
