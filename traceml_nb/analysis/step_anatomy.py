"""Where the steps went: the data wait, the input copy, the model's forward, the backward, the
optimizer's step and the rest of the loop (:mod:`traceml_nb.engine.instrument.step_phases`
times them), as each one's median over the steady steps and its share of their time.

Off a GPU the phases are host time. On a GPU every part is on the GPU timeline (the host's
time in a forward is the kernels' launch, not their work): a step is the GPU's stall for its
batch (a host wait the GPU spent computing the previous step is no part of it) and its span,
from the batch's arrival to the next fetch; the phases are GPU time (CUDA events at their
boundaries) and the rest is the span less the phases.

The medians say what a typical step spends in each part; they need not add up to the median
step. The shares do add up, to the steps' time: the data wait's is every steady step's wait
over their time (the report's "data wait share", which every step measures), and the rest of
the steps' time is split among the phases and "other" as in the timed steps (each weighted as
below), so the parts add up beside the data wait share the report gives, not beside a sample's
estimate of it (the demo's second run waited 27% of its time, and the parts shown beside it,
estimated with the wait of its timed steps alone, added up to 93%).

The phases are timed on a sample of the steps, one in about every so much training time
(:mod:`traceml_nb.engine.instrument.step_phases`): one in a few steps where the steps are
slow, one in many where they are fast, more often in the run's first seconds. So each timed
step stands for the steps from its sample to the next one (:func:`sample_weights`), and is
weighted by their number: a stretch of slow steps, a machine busy for a while, weighs what its
steps weigh among the run's, not what its samples weigh among the samples.

A sample runs from one optimizer step's end to its next, so it holds whole cycles of gradient
accumulation; but the warm-up's steps are left out of the statistics, which can cut the first
sample's cycle short (its last micro-steps kept, the one with the optimizer among them). So the
timed steps are weighted again by whether an optimizer step ran in them (a flag every step
has, timed or not): those with one and those without count in the proportions of all the
steady steps (post-stratification), and "ran in 25% of the steps" is the loop's own count, not
the sample's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..engine.step_table import PhaseRows

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
#: The input copy runs from a DataLoader batch's arrival to the forward: steps that fetch
#: none (an evaluation's loader aside) show no arrival; making or moving a batch is "other".
NO_COPY = (
    "no DataLoader batch was fetched in the steps: a batch's arrival is not seen, so making or "
    "moving the batch is timed as the rest of the step"
)
#: Where the other phases were timed and no model's forward was seen: a model called only
#: inside a function compiled with ``torch.compile`` (our hooks are traced there, and do
#: nothing), a TorchScript model (it takes no hooks), a model first called after the first
#: optimizer step (it is not sought), a model of plain tensors (``X @ w + b``, no
#: ``torch.nn.Module`` to hook). Its time, and the input copy's (which ends at the forward),
#: are then in the rest of the step.
NO_FORWARD = (
    "no forward of the model was seen: a model called inside a function compiled with "
    "torch.compile, a TorchScript model, one first called after the first optimizer step and "
    "one of plain tensors (no torch.nn.Module) are not timed; its time is in the rest of the "
    "step"
)
NO_COPY_WITHOUT_FORWARD = "it ends at the model's forward, which was not seen"
#: Where optimizer steps were timed and no ``backward()`` was seen: the gradients came another
#: way (``torch.autograd.grad``, ``torch.func.grad``, set by hand), which is not timed as the
#: backward; a loop that trains none (an evaluation) has a backward of 0 ms, as it is.
NO_BACKWARD = (
    "no backward() was seen though the optimizer stepped: gradients computed with "
    "torch.autograd.grad or torch.func, or set by hand, are timed as the rest of the step"
)
#: A phase that took no time in the timed steps and started only inside another (a model
#: called only inside the backward, a backward only inside the model's forward): it is part of
#: the outer one, as the phases are defined (one phase at a time; only an optimizer's closure
#: is timed apart from its step, :mod:`traceml_nb.engine.instrument.phase_clock`).
INSIDE = "run in the {outer}, so counted there"
#: ...and the input copy then, which ends at the forward.
COPY_INSIDE = "it ends at the model's forward, run in the {outer}"
#: How :data:`INSIDE` names each outer phase.
OUTER_WORDS = {
    "forward": "model's forward",
    "backward": "backward",
    "optimizer": "optimizer's step",
}
#: Where optimizer steps ran in the timed steps and none was timed: a step compiled with
#: ``torch.compile`` runs our pre-step hook inside its graph, where it does nothing.
NO_OPTIMIZER = (
    "the optimizer's steps ran and none was seen: one compiled with torch.compile is not timed; "
    "its time is in the rest of the step"
)
#: Where a backward ran and no step had an optimizer step: the parameters were updated another
#: way, or not at all (gradients for an attack, a saliency map), which the run cannot tell: not
#: "0 ms", which would say that no update ran.
NO_OPTIMIZER_STEP = (
    "a backward ran and no torch optimizer's step() was seen: an update made another way (by "
    "hand, p -= lr * p.grad, or with a framework's own optimizer) is timed as the rest of the "
    "step"
)
NO_GPU_PHASES = (
    "no steady step had its phases timed on the GPU: the phases' CUDA events are read with a "
    "DataLoader's steps (steps told by optimizer steps or markers, as a trainer's are, carry "
    "none), and host clocks would time the kernel launches, not the GPU's work"
)


@dataclass
class StepAnatomy:
    """The parts of the steady steps; ``why`` says why there are none ('' when measured)."""

    medians_ms: dict[str, float] = field(default_factory=dict)  #: by PHASES and "other"
    shares: dict[str, float] = field(default_factory=dict)  #: by PARTS, 0..1, summing to 1
    why: str = ""
    #: by PHASES, a phase that ran in at most half of the steps (its median is 0, as with
    #: gradient accumulation's optimizer step, or in exactly half halfway between 0 and its
    #: least time): ``(share of the steps it ran in, 0..1, its median over those steps, ms)``
    occasional: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: by PHASES, a phase not timed while the others were, and why (its time is in "other")
    unavailable: dict[str, str] = field(default_factory=dict)


def step_anatomy(
    wall_ms: np.ndarray,
    wait_ms: np.ndarray,
    phase_ms: PhaseRows,
    *,
    stepped: np.ndarray | None = None,
    gpu: tuple[PhaseRows, np.ndarray, np.ndarray] | None = None,
    inside: Iterable[tuple[str, str]] = (),
) -> StepAnatomy:
    """The anatomy of the steps whose ``wall_ms`` and ``wait_ms`` are given, with the
    ``PHASES`` of those that have them in ``phase_ms`` (positions among the steps);
    ``stepped``: whether an optimizer step ran in each step (None: the timed steps are
    weighted by the steps they stand for alone); on a GPU, ``gpu`` is the steps' ``(phases on
    the GPU timeline, GPU stall, GPU span)``, ms, NaN where unresolved, and the anatomy is
    theirs; ``inside``: the ``(outer, inner)`` phases that started inside another
    (``RunRecord.phases_inside``)."""
    if gpu is not None:
        phase_ms, stall, span = gpu
        wall_ms, wait_ms = stall + span, stall  # NaN where either is unresolved
    rows, values = phase_ms.index, phase_ms.values
    whole = np.isfinite(values).all(axis=1) & np.isfinite(wall_ms[rows])
    w = sample_weights(rows, len(wall_ms))[whole]  # (the samples as they were taken)
    rows, phases = rows[whole], values[whole]
    if not len(rows):
        return StepAnatomy(why=NO_PHASES if gpu is None else NO_GPU_PHASES)
    if not phases.any():  # timed, and nothing ran to time: a loop without a model
        return StepAnatomy(why=NO_PHASES)
    wall, wait = wall_ms[rows], wait_ms[rows]
    if stepped is not None:
        w = w * timed_weights(stepped, rows, w)
    other = np.maximum(0.0, wall - wait - phases.sum(axis=1))
    unavailable = _untimed(phases, inside)
    optimizer = phases[:, PHASES.index("optimizer")]
    if stepped is not None and stepped[rows].any() and not optimizer.any():
        unavailable["optimizer"] = NO_OPTIMIZER
    backward = phases[:, PHASES.index("backward")].any()
    if stepped is not None and not stepped.any() and backward and "optimizer" not in unavailable:
        unavailable["optimizer"] = NO_OPTIMIZER_STEP
    timed = [(i, name) for i, name in enumerate(PHASES) if name not in unavailable]
    medians = {name: weighted_median(phases[:, i], w) for i, name in timed}
    medians["other"] = weighted_median(other, w)
    known = np.isfinite(wall_ms) & np.isfinite(wait_ms)
    total = float(wall_ms[known].sum())
    waited = min(1.0, float(wait_ms[known].sum()) / total) if total > 0 else 0.0
    sums = [*(float(x) for x in w @ phases), float(w @ other)]
    rest = max(float(w @ (wall - wait)), sum(sums))  # parts of a step never add up past it
    shares = {"data_wait": waited} | {
        part: ((1.0 - waited) * x / rest if rest > 0 else 0.0)
        for part, x in zip(PARTS[1:], sums, strict=True)
        if part not in unavailable
    }
    occasional = {}
    for i, name in timed:
        ran = phases[:, i] > 0
        share = float(w[ran].sum() / w.sum())
        # its median is 0, or in exactly half of the steps halfway to its least: no time it took
        if ran.any() and (share < 0.5 or np.isclose(share, 0.5)):
            occasional[name] = (share, weighted_median(phases[ran, i], w[ran]))
    return StepAnatomy(medians, shares, occasional=occasional, unavailable=unavailable)


def _untimed(phases: np.ndarray, inside: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The phases that took no time in any timed step while others did, and why: run only
    inside another phase (``inside``), a forward not seen (the copy, which ends at it, goes
    with it), a backward not seen in steps whose optimizer stepped."""
    outer_of = {inner: outer for outer, inner in sorted(inside) if outer != inner}
    unavailable = {}
    for i, name in enumerate(PHASES):
        if name in outer_of and not phases[:, i].any():
            unavailable[name] = INSIDE.format(outer=OUTER_WORDS[outer_of[name]])
    backward, optimizer = PHASES.index("backward"), PHASES.index("optimizer")
    stepped_without = phases[:, optimizer].any() and not phases[:, backward].any()
    if stepped_without and "backward" not in unavailable:
        unavailable["backward"] = NO_BACKWARD
    if not phases[:, PHASES.index("forward")].any():  # the copy was never ended, nor timed
        if "forward" in unavailable:
            unavailable["copy"] = COPY_INSIDE.format(outer=OUTER_WORDS[outer_of["forward"]])
        else:
            unavailable.update(copy=NO_COPY_WITHOUT_FORWARD, forward=NO_FORWARD)
    return unavailable


def sample_weights(timed: np.ndarray, n: int) -> np.ndarray:
    """How many of the ``n`` steps each timed step stands for (``timed``: the positions of the
    timed steps among them, ascending). A sample is a run of consecutive timed steps (one
    step, or a cycle of gradient accumulation; where the sampling is on at every other step
    or more often, several samples in a row); it stands for itself and the steps up to the
    next sample (the first one for the steps before it too), each of its steps for an equal
    part: as the sampling took one in so many steps, at the pace it saw."""
    if not len(timed):
        return np.zeros(0)
    first = np.flatnonzero(np.diff(timed, prepend=timed[0] - 2) != 1)  # each sample's start
    length = np.diff(np.append(first, len(timed)))
    starts = timed[first]
    stretch = np.diff(np.append(starts, n))
    stretch[0] += starts[0]
    return np.repeat(stretch / length, length)


def timed_weights(stepped: np.ndarray, timed: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The factor on each timed step's weight (``timed``: their positions among the steps,
    ``weights``: theirs, :func:`sample_weights`) that makes the timed steps with an optimizer
    step and those without (``stepped``, every step's flag) count in the proportions of all
    the steps: 1 for each where they already do, or where the timed steps hold only one kind
    and there is nothing to reweight."""
    p_all = float(stepped.mean())
    ran = stepped[timed]
    p_timed = float(weights @ ran / weights.sum())
    if p_timed in (0.0, 1.0) or np.isclose(p_timed, p_all):
        return np.ones(len(timed))
    return np.where(ran, p_all / p_timed, (1.0 - p_all) / (1.0 - p_timed))


def weighted_median(values: np.ndarray, weights: np.ndarray | None) -> float:
    """The median of ``values`` (``np.median``'s), each counted by its weight: the value where
    the weights summed in order pass half of their total, the middle two's mean where they
    reach it exactly."""
    if weights is None:
        return float(np.median(values))
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    half = cum[-1] / 2
    i = int(np.searchsorted(cum, half))
    if np.isclose(cum[i], half) and i + 1 < len(v):
        return float((v[i] + v[i + 1]) / 2)
    return float(v[i])
