"""``analyze``: record → summary → diagnosis, one pure function."""

from __future__ import annotations

import numpy as np

from ..capabilities import Capabilities
from ..record import RunRecord
from .diagnosis import diagnose
from .model import Analysis
from .steps import select_rows
from .summary import measure, summarize
from .warmup import WarmupSpec


def analyze(
    record: RunRecord,
    capabilities: Capabilities,
    *,
    warmup: WarmupSpec = "auto",
    cpus_available: int | None = None,
) -> Analysis:
    """Summarise and diagnose ``record``; works on a run that is still measuring too.

    ``warmup``: ``"auto"`` or the number of leading steps to exclude. ``cpus_available``: CPUs
    the training process may use (default: the host sampler's reading, else the affinity mask).
    Reads a snapshot of the record; never writes to it.
    """
    m = measure(record, capabilities, warmup, cpus_available)
    summary = summarize(record, m)
    return Analysis(summary=summary, diagnosis=diagnose(summary, m, capabilities))


def steady_step_ms(record: RunRecord, warmup_steps: int) -> np.ndarray:
    """The steady step times (ms) of ``record``: the measured steps after ``warmup_steps``."""
    selection, _ = select_rows(record)
    return selection.wall_ms[warmup_steps:]
