"""``%%traceml --profile N``: ``torch.profiler`` over N steady steps of a run, no more.

A :class:`ProfileWindow` counts the run's step boundaries (DataLoader fetches; without a
DataLoader, ``optimizer.step()`` calls or ``traceml_nb.step()`` markers, whichever the loop
makes first) on the training thread. After ``after_steps`` of them it starts the profiler
(CPU activity, CUDA activity on a GPU) with the lines of the user's code as ranges
(:mod:`.line_ranges`), and stops it after ``steps`` more boundaries, or when the run ends.
The hooks (:mod:`.hooks`) call :meth:`ProfileWindow.boundary` only while the window is open
or pending; the steps after it pay nothing more than the run's own hot path.

As the run ends, :meth:`ProfileWindow.finish` writes the gzipped Chrome trace of the profiled
steps and reduces the profiler's events to a :class:`~traceml_nb.engine.profile_capture.ProfileCapture`.
A profiler that cannot start (another one is active, Kineto is missing, CUPTI is missing on a
GPU image) or fails never fails the run: the capture says why it is missing.
"""

from __future__ import annotations

import linecache
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...settings import profile_dir_setting
from ..profile_capture import PYTHON_OP, OpTotals, ProfileCapture, SyncTotals
from .line_ranges import LINE_RANGE, CodeLine, LineRanges

#: Steps profiled when ``--profile`` is given without a number.
DEFAULT_PROFILE_STEPS = 10
#: Steps left to the warm-up before the capture starts (``--warmup N`` overrides it): the
#: first steps hold one-time work (allocations, kernel selection, workers starting).
DEFAULT_PROFILE_AFTER_STEPS = 10
#: The CUDA runtime calls that block the host until the GPU has caught up.
SYNC_RUNTIME_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
)
#: The ``record_function`` range PyTorch puts around a DataLoader iterator's ``__next__``.
LOADER_RANGE = "enumerate(DataLoader)#"
#: Where the trace files go unless ``--profile-dir`` says otherwise.
DEFAULT_PROFILE_DIR = "traceml_profiles"

Boundary = str  #: "fetch", "optimizer" or "marker"


def profiler_unavailable() -> str:
    """Why ``torch.profiler`` cannot run in this process now ('' when it can)."""
    import torch

    try:
        if not torch.autograd.kineto_available():
            return "this PyTorch build has no Kineto profiler"
        if torch.autograd.profiler._is_profiler_enabled:  # type: ignore[attr-defined]
            return "another profiler is already active in this process"
    except Exception as exc:
        return f"the profiler could not be checked: {type(exc).__name__}: {exc}"
    return ""


class ProfileWindow:
    """The profiler over ``steps`` steps, started after ``after_steps`` step boundaries.

    ``cell_file``: the file the user's code runs from (a notebook cell's name in the line
    cache); the operators are attributed to its lines. ``trace_dir``: where the trace goes.
    ``clock``: ``perf_counter_ns``, ``t0_ns`` the run's start.
    """

    def __init__(
        self,
        steps: int,
        after_steps: int,
        *,
        cuda: bool,
        t0_ns: int,
        cell_file: str | None = None,
        trace_dir: str | os.PathLike[str] | None = None,
        name: str = "run",
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        if steps < 1:
            raise ValueError(f"the number of profiled steps must be at least 1, got {steps}")
        self.steps = steps
        self.after_steps = max(0, after_steps)
        self.cuda = cuda
        self.t0_ns = t0_ns
        self.cell_file = cell_file
        self.trace_dir = trace_dir
        self.name = name
        self.clock = clock
        #: "pending" (counting), "open" (profiling), "closed" (done, or never to start)
        self.state = "pending"
        self.kind: Boundary | None = None  #: the boundary the window counts
        self.seen = 0  #: boundaries counted before the start
        self.profiled = 0  #: steps completed inside the window
        self.why = ""
        #: the user's lines as profiler ranges while the window is open
        self.lines = LineRanges(cell_file)
        self._profiler: Any = None
        # the window (start() called .. stop() returned) and the profiled steps inside it
        # (start() returned .. stop() called), perf_counter_ns
        self._start_ns: int | None = None
        self._stop_ns: int | None = None
        self._first_ns = 0
        self._last_ns = 0

    # --- the training thread ----------------------------------------------------------------
    def boundary(self, kind: Boundary) -> None:
        """A step boundary of ``kind`` on the training thread (the hooks call it)."""
        if self.kind != kind:
            # the loop's own kind of boundary: the first seen, or markers once they appear
            if self.kind is None or (kind == "marker" and self.state == "pending"):
                self.kind, self.seen = kind, 0
            else:
                return
        if self.state == "pending":
            if self.seen >= self.after_steps:
                self._start()
            else:
                self.seen += 1
        elif self.state == "open":
            self.profiled += 1
            if self.profiled >= self.steps:
                self._stop()

    @property
    def done(self) -> bool:
        return self.state == "closed"

    def _start(self) -> None:
        why = profiler_unavailable()
        if why:
            self._close(why)
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        self._start_ns = self.clock()
        try:
            profiler = profile(activities=activities, record_shapes=False)
            profiler.start()
        except Exception as exc:
            self._start_ns = None
            self._close(f"the profiler failed to start: {type(exc).__name__}: {exc}")
            return
        self._profiler = profiler
        self.state = "open"
        try:
            self.lines.start(sys._getframe())
        except Exception as exc:
            self.lines.stop()
            self.lines.why = f"the lines could not be traced: {type(exc).__name__}: {exc}"
        self._first_ns = self.clock()

    def _stop(self) -> None:
        self._last_ns = self.clock()
        self.lines.stop()
        try:
            self._profiler.stop()
        except Exception as exc:
            self.why = self.why or f"the profiler failed to stop: {type(exc).__name__}: {exc}"
            self._profiler = None
        self._stop_ns = self.clock()
        self._close("")

    def _close(self, why: str) -> None:
        self.state = "closed"
        self.why = self.why or why

    def leave(self) -> None:
        """In a process forked while the window profiles (a DataLoader worker): its thread,
        the forking one, stops tracing the cell's lines and recording operators, which it
        would do for as long as it lived (measured: a persistent worker 7x slower, +1.3 KB an
        operator, never read). The profiler is not stopped there: its flush may need the
        CUDA driver, which a forked process cannot use."""
        if self.state != "open":
            return
        self.state, self._profiler = "closed", None
        try:
            self.lines.stop()
        finally:
            try:
                import torch

                torch._C._autograd._enable_record_function(False)
            except Exception:
                pass

    # --- the run's end ----------------------------------------------------------------------
    def end(self, ended_by: str = "the run ended") -> None:
        """The run has ended (``ended_by`` says how): stop a capture still open, give up one
        still pending. Quick; safe to call twice."""
        if self.state == "pending":
            # a fetch begins a step, and the iterator's last call ends the last one
            seen = max(0, self.seen - 1) if self.kind == "fetch" else self.seen
            self._close(
                f"{ended_by} after {seen} step{'s' if seen != 1 else ''}, before the "
                f"{self.after_steps} steps the capture waits for"
            )
        elif self.state == "open":
            self._stop()
            if self.profiled < self.steps:
                self.why = self.why or (
                    f"{ended_by} after {self.profiled} of the {self.steps} profiled steps"
                )

    def finish(self, ended_by: str = "the run ended") -> ProfileCapture:
        """:meth:`end`, then write the trace and reduce the profiler's events (seconds, for a
        large capture: after the run's own time is taken)."""
        self.end(ended_by)
        capture = ProfileCapture(requested=self.steps, after_steps=self.after_steps, why=self.why)
        profiler, self._profiler = self._profiler, None
        if self._start_ns is None or self._stop_ns is None:
            return capture  # never started: no step was profiled
        # the steps in the window ran under the profiler, read or not
        capture.window_ns = (self._start_ns - self.t0_ns, self._stop_ns - self.t0_ns)
        if profiler is None:
            return capture
        capture.steps = self.profiled
        capture.wall_us = (self._last_ns - self._first_ns) / 1e3
        capture.activities = ("cpu", "cuda") if self.cuda else ("cpu",)
        capture.lines_why = self.lines.why
        try:
            reduce_events(profiler.events(), capture, self.lines.lines, self.cell_file)
        except Exception as exc:
            capture.why = capture.why or (
                f"the profile could not be read: {type(exc).__name__}: {exc}"
            )
            capture.steps = 0
            return capture
        try:
            path = trace_path(self.trace_dir, self.name)
            profiler.export_chrome_trace(str(path))
            capture.trace_path, capture.trace_bytes = str(path), path.stat().st_size
        except Exception as exc:
            capture.why = capture.why or (
                f"the trace file could not be written: {type(exc).__name__}: {exc}"
            )
        return capture


def trace_path(trace_dir: str | os.PathLike[str] | None, name: str) -> Path:
    """``DIR/NAME-YYYYmmdd-HHMMSS.pt.trace.json.gz`` (``--profile-dir``, else
    ``TRACEML_NB_PROFILE_DIR``, else ``./traceml_profiles``), the directory made if need be."""
    base = Path(trace_dir or profile_dir_setting() or DEFAULT_PROFILE_DIR)
    base.mkdir(parents=True, exist_ok=True)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("_") or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"{stem[:40]}-{stamp}.pt.trace.json.gz"
    n = 1
    while path.exists():
        n += 1
        path = base / f"{stem[:40]}-{stamp}-{n}.pt.trace.json.gz"
    return path


# --- from the profiler's events to the capture ---------------------------------------------------
def _lines_of(event: Any, lines: dict[str, CodeLine]) -> list[CodeLine]:
    """The user lines an event ran inside (from its line ranges), innermost first."""
    out = []
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        name = str(parent.name)
        if name.startswith(LINE_RANGE):
            line = lines.get(name[len(LINE_RANGE) :])
            if line is not None:
                out.append(line)
        parent = getattr(parent, "cpu_parent", None)
    return out


def _top_op(event: Any) -> Any:
    """The outermost operator an event runs inside, line ranges aside (itself without one)."""
    top, parent = event, getattr(event, "cpu_parent", None)
    while parent is not None:
        if not str(parent.name).startswith(LINE_RANGE):
            top = parent
        parent = getattr(parent, "cpu_parent", None)
    return top


def reduce_events(
    events: Any, capture: ProfileCapture, lines: dict[str, CodeLine], cell_file: str | None
) -> None:
    """Fill ``capture`` from the profiler's events (``profile.events()``); ``lines``: the line
    ranges' keys (:class:`~.line_ranges.LineRanges`), ``cell_file`` the profiled code's file
    (where the source lines are read)."""
    ops: dict[str, OpTotals] = {}
    syncs: dict[tuple[str, int | None], SyncTotals] = {}
    kernels: list[tuple[float, float]] = []
    loader_us = 0.0
    device_time = "self_device_time_total"  # its name from PyTorch 2.4 on
    if events and not hasattr(events[0], device_time):
        device_time = "self_cuda_time_total"
    for event in events:
        name = str(event.name)
        device = str(getattr(event, "device_type", "")).rsplit(".", 1)[-1]
        start = float(event.time_range.start)
        end = float(event.time_range.end)
        if device in ("CUDA", "PrivateUse1"):
            kernels.append((start, end))
            continue
        if name.startswith(LOADER_RANGE):
            loader_us += end - start
        self_cpu = float(getattr(event, "self_cpu_time_total", 0.0) or 0.0)
        self_dev = float(getattr(event, device_time, 0.0) or 0.0)
        within = _lines_of(event, lines)
        if name.startswith(LINE_RANGE):
            own = lines.get(name[len(LINE_RANGE) :])
            if own is None:
                continue
            within = [own, *within]
            name = f"{PYTHON_OP}, {own.words()}"
        cell_line = within[-1].line if within else None  # the outermost: the loop's own line
        if name in SYNC_RUNTIME_CALLS:
            waiting = _top_op(event)
            key = (str(waiting.name) if waiting is not event else name, cell_line)
            sync = syncs.setdefault(key, SyncTotals(key[0], cell_line))
            sync.calls += 1
            sync.wait_us += end - start
        op = ops.get(name)
        if op is None:
            op = ops[name] = OpTotals(name)
        op.calls += 1
        op.self_cpu_us += self_cpu
        op.self_device_us += self_dev
        place = (cell_line, within[0].words() if within else None)
        op.places[place] = op.places.get(place, 0.0) + self_cpu
    capture.ops = sorted(ops.values(), key=lambda o: o.self_cpu_us, reverse=True)
    capture.syncs = sorted(syncs.values(), key=lambda s: s.wait_us, reverse=True)
    capture.kernels = sorted(kernels)
    capture.loader_us = loader_us
    if cell_file is not None:
        named = {o.line for o in capture.ops[:20]} | {s.line for s in capture.syncs}
        for n in sorted(n for n in named if n is not None):
            text = linecache.getline(cell_file, n).strip()
            if text:
                capture.source_lines[n] = text
