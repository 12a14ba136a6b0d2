"""What a ``--profile`` capture says about the profiled steps: the operators that took the time,
the calls that waited for the GPU, the GPU's idle gaps, and the cause a verdict can name.

Pure functions from a :class:`~traceml_nb.engine.profile_capture.ProfileCapture` and the run's steps
to a :class:`ProfileSummary`. Every share is of the profiled steps' time (from the capture's
start to its stop); per-step figures divide by the steps profiled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..engine.profile_capture import PYTHON_OP, OpTotals, ProfileCapture
from ..engine.record import FLAG_INTERLEAVED, FLAG_PROFILED
from .findings import Finding, Summary
from .steps import StepSelection
from .thresholds import (
    GPU_BUSY_PCT,
    LAUNCH_BOUND_IDLE_SHARE,
    PROFILE_TOP_OPS,
    SYNC_CAUSE_SHARE,
)

#: How the profiler names a DataLoader iterator's ``__next__`` in the report.
LOADER_OP = "DataLoader __next__ (data loading)"
#: The advice to rerun the cell with ``%%traceml --profile N`` (to see which operations and
#: lines take the time).
PROFILE_SUGGESTION = "profile-suggestion"
#: The steps the suggested rerun profiles (``--profile N``).
SUGGESTED_PROFILE_STEPS = 10


@dataclass
class OpLine:
    """One operator's share of the profiled steps."""

    name: str
    share: float  #: its self time / the profiled steps' time
    ms_per_step: float  #: its self time per profiled step, ms
    calls_per_step: float
    line: int | None = None  #: the cell line that spent most of it
    code: str | None = None  #: that line's text
    frame: str | None = None  #: the innermost line of the profiled code, as words
    #: not an operator: the Python time of a line outside PyTorch's operators
    python: bool = False


@dataclass
class SyncLine:
    """Host time spent waiting for the GPU from one operator at one cell line."""

    op: str
    ms_per_step: float
    calls_per_step: float
    share: float  #: of the profiled steps' time
    line: int | None = None
    code: str | None = None


@dataclass
class ProfileSummary:
    """The profile of ``steps`` steps (``requested`` asked for); ``why`` says why it is
    missing or partial ('' when whole)."""

    requested: int
    steps: int
    step_ms: float | None = None  #: the profiled steps' mean time, ms
    top_cpu: list[OpLine] = field(default_factory=list)  #: by self CPU time
    top_gpu: list[OpLine] = field(default_factory=list)  #: by self GPU time (CUDA runs)
    syncs: list[SyncLine] = field(default_factory=list)
    #: share of the profiled time the GPU ran no kernel (None: no GPU activity captured)
    gpu_idle_share: float | None = None
    gpu_idle_why: str = ""
    loader_share_profiler: float | None = None  #: the DataLoader's share, as profiled
    loader_share_steps: float | None = None  #: ...and as our step timing measured it
    trace_path: str | None = None
    trace_bytes: int | None = None
    why: str = ""

    @property
    def captured(self) -> bool:
        return self.steps > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProfileSummary:
        obj = cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        obj.top_cpu = [OpLine(**o) if isinstance(o, dict) else o for o in obj.top_cpu]
        obj.top_gpu = [OpLine(**o) if isinstance(o, dict) else o for o in obj.top_gpu]
        obj.syncs = [SyncLine(**o) if isinstance(o, dict) else o for o in obj.syncs]
        return obj


def _display_name(op: OpTotals) -> str:
    return LOADER_OP if op.name.startswith("enumerate(DataLoader)#") else op.name


def _op_lines(capture: ProfileCapture, key: str, wall_us: float, steps: int) -> list[OpLine]:
    ranked = sorted(
        (op for op in capture.ops if getattr(op, key) > 0),
        key=lambda op: getattr(op, key),
        reverse=True,
    )
    out = []
    for op in ranked[:PROFILE_TOP_OPS]:
        us = float(getattr(op, key))
        line = op.line
        out.append(
            OpLine(
                name=_display_name(op),
                share=us / wall_us,
                ms_per_step=us / steps / 1e3,
                calls_per_step=op.calls / steps,
                line=line,
                code=capture.source_lines.get(line) if line is not None else None,
                frame=op.frame,
                python=op.name.startswith(PYTHON_OP),
            )
        )
    return out


def gpu_idle_share(kernels: list[tuple[float, float]], span_us: float) -> float | None:
    """The share of ``span_us`` in which no kernel ran, from kernel intervals (µs, any order,
    possibly overlapping); None when no kernel ran or the span is empty."""
    if not kernels or span_us <= 0:
        return None
    busy = 0.0
    end = -np.inf
    for start, stop in sorted(kernels):
        if stop <= end:
            continue
        busy += stop - max(start, end)
        end = stop
    return max(0.0, 1.0 - busy / span_us)


def _loader_share_steps(selection: StepSelection | None) -> float | None:
    """Our data wait share over the profiled steps (None without them)."""
    if selection is None or not len(selection):
        return None
    flags = selection.flags
    mine = ((flags & FLAG_PROFILED) != 0) & ((flags & FLAG_INTERLEAVED) == 0)
    wall = float(selection.wall_ms[mine].sum())
    return float(selection.wait_ms[mine].sum()) / wall if wall > 0 else None


def summarize_profile(
    capture: ProfileCapture | None,
    selection: StepSelection | None = None,
    has_loader: bool = True,
) -> ProfileSummary | None:
    """The :class:`ProfileSummary` of ``capture`` (None: no profile was asked for);
    ``selection``: the run's steps, for our own data wait
    share beside the profiler's."""
    if capture is None:
        return None
    out = ProfileSummary(capture.requested, capture.steps, why=capture.why)
    out.trace_path, out.trace_bytes = capture.trace_path, capture.trace_bytes
    if not capture.captured or capture.wall_us <= 0:
        out.steps = 0
        out.why = out.why or "no step was profiled"
        return out
    steps, wall = capture.steps, capture.wall_us
    out.step_ms = wall / steps / 1e3
    out.top_cpu = _op_lines(capture, "self_cpu_us", wall, steps)
    if "cuda" in capture.activities:
        out.top_gpu = _op_lines(capture, "self_device_us", wall, steps)
        out.gpu_idle_share = gpu_idle_share(capture.kernels, wall)
        if out.gpu_idle_share is None:
            out.gpu_idle_why = "no GPU kernel was captured (CUPTI may be missing on this image)"
    else:
        out.gpu_idle_why = "the profile captured the CPU only"
    out.syncs = [
        SyncLine(
            op=s.op,
            ms_per_step=s.wait_us / steps / 1e3,
            calls_per_step=s.calls / steps,
            share=s.wait_us / wall,
            line=s.line,
            code=capture.source_lines.get(s.line) if s.line is not None else None,
        )
        for s in capture.syncs
    ]
    if has_loader and capture.loader_us is not None:
        out.loader_share_profiler = capture.loader_us / wall
        out.loader_share_steps = _loader_share_steps(selection)
    return out


def profile_cause(profile: ProfileSummary | None, verdict: str) -> Finding | None:
    """The cause a host-bound or compute-bound verdict names from the profile (None: no
    profile, another verdict, or nothing stands out): ``profile-sync`` (a call that waits for
    the GPU, ``sync`` a :class:`SyncLine`), ``profile-launch-bound`` (the GPU idle
    ``idle_share`` of the profiled time, ``top`` the host's top :class:`OpLine` or None) or
    ``profile-top-op`` (``op``); ``step_ms``: the profiled step."""
    if profile is None or not profile.captured or verdict not in ("host-bound", "compute-bound"):
        return None
    step = profile.step_ms or 0.0
    top_sync = profile.syncs[0] if profile.syncs else None
    if top_sync is not None and top_sync.share >= SYNC_CAUSE_SHARE:
        return Finding("profile-sync", {"sync": asdict(top_sync), "step_ms": step})
    ops = [op for op in profile.top_cpu if op.name != LOADER_OP]
    if (
        profile.gpu_idle_share is not None
        and profile.gpu_idle_share >= LAUNCH_BOUND_IDLE_SHARE
        and verdict == "host-bound"
    ):
        top = asdict(ops[0]) if ops else None
        facts = {"idle_share": profile.gpu_idle_share, "top": top, "step_ms": step}
        return Finding("profile-launch-bound", facts)
    if not ops:
        return None
    return Finding("profile-top-op", {"op": asdict(ops[0]), "step_ms": step})


def suggests_profile(summary: Summary, verdict: str, confidence: str) -> bool:
    """The report suggests a ``--profile`` rerun: a host-bound run, a compute-bound one whose
    GPU is under ``GPU_BUSY_PCT`` busy, or a verdict of low confidence."""
    if verdict == "insufficient-data":
        return False
    if verdict == "host-bound" or confidence == "low":
        return True
    util = summary.gpu_util_median_pct
    return verdict == "compute-bound" and util is not None and util < GPU_BUSY_PCT
