"""The words every layer shares: run statuses, verdicts, step sources, capability names.

Each is a ``Literal`` (the values are plain strings, so results stay JSON as they are) with a
tuple of its values for checks at the boundaries (a loaded history file, ``--view``).
"""

from __future__ import annotations

from typing import Literal, get_args

RunStatus = Literal["created", "running", "completed", "failed", "interrupted"]
#: The statuses of a run that has ended (what the history and the report hold).
EndStatus = Literal["completed", "failed", "interrupted"]
END_STATUSES: tuple[EndStatus, ...] = get_args(EndStatus)

Verdict = Literal[
    "input-bound",
    "host-bound",
    "compute-bound",
    "throttled",
    "memory-pressure",
    "insufficient-data",
]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
#: Verdicts that name a problem; moving from one of them to ``compute-bound`` is an improvement.
PROBLEM_VERDICTS: tuple[Verdict, ...] = (
    "input-bound",
    "host-bound",
    "throttled",
    "memory-pressure",
)

Confidence = Literal["low", "medium", "high"]
CONFIDENCE_LEVELS: tuple[Confidence, ...] = get_args(Confidence)

#: Where the measured steps come from: explicit ``traceml_nb.step()`` markers, the training
#: DataLoader's batches, ``optimizer.step()`` boundaries, or nothing at all.
StepSource = Literal["marker", "dataloader", "optimizer", "none"]

#: What a run can measure; each is available or unavailable with a reason
#: (:class:`traceml_nb.engine.capabilities.Capabilities`).
Capability = Literal[
    "steps",
    "data_wait",
    "gpu_events",
    "gpu_memory",
    "nvml",
    "gpu_utilisation",
    "host",
    "steal_time",
    "profile",
]
CAPABILITIES: tuple[Capability, ...] = get_args(Capability)

#: NVML clock-event (throttle) reason bits and their names, as ``nvmlDeviceGetCurrentClocksEventReasons``
#: reports them. The GPU sampler records the bit mask; the analysis decides which of them slow a
#: busy GPU down (``traceml_nb.analysis.thresholds.THROTTLE_REASON_MASK``).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}
