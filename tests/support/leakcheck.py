"""What of traceml_nb is still installed or running after a test (used by conftest.py)."""

from __future__ import annotations

import sys
import threading
import time

import torch
import torch.optim.optimizer as optim_mod
from torch.utils.data.dataloader import _BaseDataLoaderIter

ORIGINAL_NEXT = _BaseDataLoaderIter.__dict__["__next__"]
ORIGINAL_BACKWARD = torch.autograd.backward


#: Threads of ours that one test left running and that test was failed for: a thread cannot be
#: stopped from outside, so the tests after it are judged on new leaks only.
_REPORTED: set[threading.Thread] = set()


def our_threads() -> list[threading.Thread]:
    """Our live threads (named ``traceml…``), less those an earlier test was failed for."""
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("traceml") and t.is_alive() and t not in _REPORTED
    ]


def leak_report(grace_s: float = 3.0) -> list[str]:
    """What of ours is still installed or running; [] when clean."""
    from traceml_nb.engine import run as run_mod
    from traceml_nb.engine.instrument import hooks
    from traceml_nb.engine.instrument import launch_patch as ranks

    problems = []
    deadline = time.monotonic() + grace_s
    while our_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    if our_threads():
        problems.append(f"threads left running: {[t.name for t in our_threads()]}")
    if _BaseDataLoaderIter.__dict__["__next__"] is not ORIGINAL_NEXT:
        problems.append("_BaseDataLoaderIter.__next__ is still patched")
    posthooks = getattr(optim_mod, "_global_optimizer_post_hooks", {})
    if any("StepTracer" in getattr(h, "__qualname__", "") for h in posthooks.values()):
        problems.append("optimizer step hook left registered")
    if any("_window_hook" in getattr(h, "__qualname__", "") for h in posthooks.values()):
        problems.append("the profile window's optimizer step hook left registered")
    prehooks = getattr(optim_mod, "_global_optimizer_pre_hooks", {})
    if any(
        "StepPhases" in getattr(h, "__qualname__", "")
        for h in (*posthooks.values(), *prehooks.values())
    ):
        problems.append("the phase instruments' optimizer step hooks left registered")
    module_hooks = (
        *torch.nn.modules.module._global_forward_pre_hooks.values(),
        *torch.nn.modules.module._global_forward_hooks.values(),
    )
    if any("StepPhases" in getattr(h, "__qualname__", "") for h in module_hooks):
        problems.append("the phase instruments' global module hooks left registered")
    if torch.autograd.backward is not ORIGINAL_BACKWARD:
        problems.append("torch.autograd.backward is still wrapped")
    if torch.autograd.profiler._is_profiler_enabled:
        problems.append("a profiler left running")
    trace = sys.gettrace()
    if trace is not None and "LineRanges" in getattr(trace, "__qualname__", ""):
        problems.append("the profile's line tracing left on")
    if hooks.is_installed():
        problems.append("tracer still installed")
    if ranks.is_installed() or ranks.is_patched():
        problems.append("torch.multiprocessing.start_processes is still patched")
    launched = rank_processes()
    while launched and time.monotonic() < deadline:
        time.sleep(0.02)
        launched = rank_processes()
    if launched:
        problems.append(f"launched rank processes left running: {[p.pid for p in launched]}")
    if run_mod.active_run() is not None:
        problems.append(f"run still active: {run_mod.active_run()!r}")
    return problems


def rank_processes() -> list:
    """Live child processes started by ``torch.multiprocessing.start_processes`` (their target
    is torch's ``_wrap``, directly or through torch.distributed.elastic)."""
    import multiprocessing

    return [
        p
        for p in multiprocessing.active_children()
        if getattr(getattr(p, "_target", None), "__module__", "").startswith(
            ("torch.multiprocessing.", "torch.distributed.")
        )
    ]


def force_clean() -> None:
    """Undo whatever was left, so that one leak does not fail every following test (threads
    cannot be undone: they are remembered and not reported again)."""
    from traceml_nb.engine import run as run_mod
    from traceml_nb.engine.instrument import hooks
    from traceml_nb.engine.instrument import launch_patch as ranks

    _REPORTED.update(our_threads())
    hooks.uninstall()
    ranks.uninstall()
    for process in rank_processes():
        process.kill()
        process.join(5)
    _BaseDataLoaderIter.__next__ = ORIGINAL_NEXT
    torch.autograd.backward = ORIGINAL_BACKWARD
    sys.settrace(None)
    run_mod._active = None
