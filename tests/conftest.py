"""Shared fixtures. The autouse ``no_leaks`` check fails any test that leaves behind a thread,
a hook, a patched method or an active run of ours."""

from __future__ import annotations

import os
import threading
import time

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402
import torch.optim.optimizer as optim_mod  # noqa: E402
from torch.utils.data.dataloader import _BaseDataLoaderIter  # noqa: E402

ORIGINAL_NEXT = _BaseDataLoaderIter.__dict__["__next__"]


def _our_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("traceml") and t.is_alive()]


def leak_report() -> list[str]:
    """What of ours is still installed or running; [] when clean."""
    from traceml_nb import run as run_mod
    from traceml_nb.instrument import patches

    problems = []
    deadline = time.monotonic() + 3.0
    while _our_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    if _our_threads():
        problems.append(f"threads left running: {[t.name for t in _our_threads()]}")
    if _BaseDataLoaderIter.__dict__["__next__"] is not ORIGINAL_NEXT:
        problems.append("_BaseDataLoaderIter.__next__ is still patched")
    hooks = getattr(optim_mod, "_global_optimizer_post_hooks", {})
    if any(getattr(h, "__self__", None).__class__.__name__ == "StepTracer" for h in hooks.values()):
        problems.append("optimizer step hook left registered")
    if patches.is_installed():
        problems.append("tracer still installed")
    if run_mod.active_run() is not None:
        problems.append(f"run still active: {run_mod.active_run()!r}")
    return problems


@pytest.fixture(autouse=True)
def no_leaks():
    yield
    problems = leak_report()
    if problems:
        # clean up so one leak does not fail every following test
        from traceml_nb import run as run_mod
        from traceml_nb.instrument import patches

        patches.uninstall()
        _BaseDataLoaderIter.__next__ = ORIGINAL_NEXT
        run_mod._active = None
        pytest.fail("traceml_nb left state behind: " + "; ".join(problems))


@pytest.fixture
def cpu_only_torch():
    """Torch as it is here (CPU build); the tests assert that."""
    assert not torch.cuda.is_available()
    return torch
