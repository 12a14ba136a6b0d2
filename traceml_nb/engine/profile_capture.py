"""What a bounded ``torch.profiler`` capture of a run leaves behind (``%%traceml --profile N``):
plain records, free of torch, that the analysis (:mod:`traceml_nb.analysis.profile_summary`) reads.

The capture (:mod:`traceml_nb.engine.instrument.profiler`) profiles N steady steps of a run and
reduces the profiler's events to these records as the run ends: operators aggregated by name,
the synchronising calls with the line they come from, the kernels' intervals on the GPU. Times
are microseconds, as the profiler gives them; a *line* is a line number of the profiled cell
(of the file the user's code runs from, outside a notebook).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The name the Python time of a line outside PyTorch's operators goes by among the operators
#: (``Python code, line 7``): the time of the line's own profiler range, operators excluded.
PYTHON_OP = "Python code"


@dataclass
class OpTotals:
    """One operator over the profiled steps (``aten::addmm``, a ``record_function`` range).

    ``self_cpu_us``: host time inside the operator itself, its children excluded.
    ``self_device_us``: time of its kernels on the GPU (0 off CUDA).
    ``places``: self CPU microseconds by where it was called from: the line of the profiled
    code's loop (the outermost line) and the innermost line of that code, as words
    (``line 5 in forward``); ``(None, None)`` outside the profiled code's lines.
    """

    name: str
    calls: int = 0
    self_cpu_us: float = 0.0
    self_device_us: float = 0.0
    places: dict[tuple[int | None, str | None], float] = field(default_factory=dict)

    def _top_place(self) -> tuple[int | None, str | None]:
        known = {k: v for k, v in self.places.items() if k[0] is not None}
        return max(known, key=known.__getitem__) if known else (None, None)

    @property
    def line(self) -> int | None:
        """The outermost line that spent the most of this operator's time (None: none seen)."""
        return self._top_place()[0]

    @property
    def frame(self) -> str | None:
        """...and the innermost line of those calls, as words."""
        return self._top_place()[1]


@dataclass
class SyncTotals:
    """Calls that made the host wait for the GPU (``cudaStreamSynchronize`` and its kin) from
    one operator at one cell line: ``.item()`` is ``aten::_local_scalar_dense``, ``.cpu()`` an
    ``aten::copy_`` to the host."""

    op: str  #: the operator that waited (its outermost one: ``aten::item``)
    line: int | None  #: the cell line of the call (None: not seen in the cell)
    calls: int = 0
    wait_us: float = 0.0  #: host time inside the synchronising runtime calls


@dataclass
class ProfileCapture:
    """The profiler's view of ``steps`` profiled steps of a run.

    ``window_ns``: when the capture started and stopped, ``perf_counter_ns`` relative to the
    run start; the steps that overlap it are left out of the run's statistics.
    ``why``: why there is no capture, or why it is partial ('' when it is whole).
    """

    requested: int  #: steps asked for (``--profile N``)
    after_steps: int  #: steps the capture waited for before it started
    steps: int = 0  #: steps profiled (fewer than requested when the run ended first)
    window_ns: tuple[int, int] | None = None
    #: the profiled steps' time, from the first boundary after the profiler started to the
    #: last one before it stopped
    wall_us: float = 0.0
    activities: tuple[str, ...] = ()  #: "cpu", "cuda"
    ops: list[OpTotals] = field(default_factory=list)
    syncs: list[SyncTotals] = field(default_factory=list)
    #: each kernel's (start, end) on the GPU timeline, in order (empty off CUDA)
    kernels: list[tuple[float, float]] = field(default_factory=list)
    #: host time inside the DataLoader's ``__next__`` as the profiler saw it
    loader_us: float | None = None
    trace_path: str | None = None  #: the gzipped Chrome trace of the profiled steps
    trace_bytes: int | None = None
    source_lines: dict[int, str] = field(default_factory=dict)  #: text of the lines named
    why: str = ""
    lines_why: str = ""  #: why the operators have no lines ('' when they have)

    @property
    def captured(self) -> bool:
        return self.steps > 0 and self.window_ns is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "after_steps": self.after_steps,
            "steps": self.steps,
            "window_ns": list(self.window_ns) if self.window_ns else None,
            "wall_us": self.wall_us,
            "activities": list(self.activities),
            "trace_path": self.trace_path,
            "trace_bytes": self.trace_bytes,
            "why": self.why,
            "lines_why": self.lines_why,
        }
