"""Where the steps went: the data wait, the input copy, the model's forward, the backward, the
optimizer's step and the rest of the loop (:mod:`traceml_nb.engine.instrument.step_phases`
times them), as each one's median over the steady steps and its share of their time.

The medians say what a typical step spends in each part; they need not add up to the median
step. The shares do add up: each part's time summed over the steps whose phases are known,
divided by those steps' time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: The parts of a step timed by the phase instruments, in the record's ``PHASE_COLUMNS`` order.
PHASES = ("copy", "forward", "backward", "optimizer")
#: Every part of a step, in the order of the step: the data wait, the phases, and the rest
#: (what the loop does besides: ``zero_grad()``, logging, metrics).
PARTS = ("data_wait", *PHASES, "other")
#: The Summary field of each timed part's median, ms.
MEDIAN_FIELDS = {part: f"{part}_ms_median" for part in (*PHASES, "other")}

NO_PHASES = (
    "no forward of a module holding parameters, no backward and no optimizer step were seen in "
    "the steady steps"
)
ON_GPU = (
    "on a GPU the phases need CUDA events at their boundaries, not recorded yet: host clocks "
    "would time the kernel launches, not the GPU's work"
)


@dataclass
class StepAnatomy:
    """The parts of the steady steps; ``why`` says why there are none ('' when measured)."""

    medians_ms: dict[str, float] = field(default_factory=dict)  #: by PHASES and "other"
    shares: dict[str, float] = field(default_factory=dict)  #: by PARTS, 0..1, summing to 1
    why: str = ""


def step_anatomy(
    wall_ms: np.ndarray, wait_ms: np.ndarray, phase_ms: np.ndarray, *, on_gpu: bool = False
) -> StepAnatomy:
    """The anatomy of the steps whose ``wall_ms``, ``wait_ms`` and ``phase_ms`` (a row each,
    ``PHASES`` columns, NaN where a row has none) are given."""
    if on_gpu:
        return StepAnatomy(why=ON_GPU)
    known = np.isfinite(phase_ms).all(axis=1) if len(phase_ms) else np.zeros(0, bool)
    if not known.any():
        return StepAnatomy(why=NO_PHASES)
    wall, wait, phases = wall_ms[known], wait_ms[known], phase_ms[known]
    other = np.maximum(0.0, wall - wait - phases.sum(axis=1))
    medians = {name: float(np.median(phases[:, i])) for i, name in enumerate(PHASES)}
    medians["other"] = float(np.median(other))
    total = float(wall.sum())
    sums = [float(wait.sum()), *(float(x) for x in phases.sum(axis=0)), float(other.sum())]
    scale = max(total, sum(sums))  # parts of a step never add up past the step
    shares = {part: (x / scale if scale > 0 else 0.0) for part, x in zip(PARTS, sums, strict=True)}
    return StepAnatomy(medians, shares)
