"""The same-job A/B gate's decision: paired per-round ratios of a base (A) and a head (B).

The gate (``python -m traceml_nb ab``) runs the base and the head alternately, ABBA (round 1:
A then B, round 2: B then A, ...), each run a whole training command. Each round gives one
paired ratio ``d = ln(median step of B / median step of A)``: the two runs of a round ran side
by side, so the machine's slow drift (and, over pairs of rounds, a linear trend) cancels in it.
The change is judged by :func:`~.judge.judge` on the rounds themselves: ``delta`` the mean of
the ratios, ``se`` their standard deviation over sqrt(k), ``k - 1`` degrees of freedom (a
paired t), against the allowed slowdown, one-sided: a gate asks "is it slower?".

The gate looks after every round from ``MIN_AB_ROUNDS`` on and stops at the first decided look
("slower" or "no significant change" = not slower); after the rounds allowed it is
inconclusive, with the rounds that would decide. Since it looks many times, each look uses
``AB_FALSE_ALARM_PER_LOOK`` and ``AB_MISS_PER_LOOK``, far below a single comparison's levels:
the rates of the whole procedure are measured by simulation in tests/unit/test_paired.py.

Everything here is pure: numbers in, a :class:`~.judge.Judgement` out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .judge import Judgement, judge
from .thresholds import AB_FALSE_ALARM_PER_LOOK, AB_MISS_PER_LOOK, MIN_AB_ROUNDS


def log_ratio(a_ms: float, b_ms: float) -> float:
    """One round's paired ratio: ln(B / A) of the two runs' median step times (ms, > 0)."""
    if not (a_ms > 0 and b_ms > 0):
        raise ValueError(f"median step times must be positive, got A={a_ms!r}, B={b_ms!r}")
    return math.log(b_ms / a_ms)


def round_order(index: int) -> tuple[str, str]:
    """The order of round ``index`` (1-based) in ABBA: ("A", "B") for odd rounds, ("B", "A")
    for even ones, so that a linear drift across the job cancels over each pair of rounds."""
    if index < 1:
        raise ValueError(f"rounds are counted from 1, got {index!r}")
    return ("A", "B") if index % 2 == 1 else ("B", "A")


def _spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (k - 1 in the denominator)."""
    k = len(values)
    mean = math.fsum(values) / k
    var = math.fsum((v - mean) ** 2 for v in values) / (k - 1)
    return mean, math.sqrt(var)


def judge_rounds(
    log_ratios: Sequence[float],
    max_slowdown: float,
    *,
    false_alarm_rate: float = AB_FALSE_ALARM_PER_LOOK,
    miss_rate: float = AB_MISS_PER_LOOK,
    more: bool = True,
) -> Judgement:
    """Judge the paired per-round log ratios ln(B/A) of ``k >= 2`` rounds against
    ``max_slowdown`` (a fraction, 0.10 = 10%), one-sided, at one look's levels. With ``more``,
    an inconclusive verdict carries the further rounds that would decide (``more_needed``),
    were the mean and the spread of the ratios to stay as they are (a search of up to
    ``MAX_RUNS_NEEDED`` t quantiles: the gate asks for it at its last look only)."""
    k = len(log_ratios)
    if k < 2:
        raise ValueError(f"a paired judgement needs at least 2 rounds, got {k}")
    mean, sd = _spread(log_ratios)

    def with_more(m: int) -> tuple[float, float]:
        return sd / math.sqrt(k + m), float(k + m - 1)

    return judge(
        mean,
        sd / math.sqrt(k),
        float(k - 1),
        max_slowdown,
        one_sided=True,
        se_with_more=with_more if more else None,
        false_alarm_rate=false_alarm_rate,
        miss_rate=miss_rate,
    )


@dataclass(frozen=True)
class Look:
    """The gate after a round: ``judgement`` of the rounds so far (None: fewer than
    ``MIN_AB_ROUNDS``, no look yet); ``stop``: decided, or the rounds allowed are done."""

    rounds: int
    judgement: Judgement | None
    stop: bool


def look(log_ratios: Sequence[float], max_slowdown: float, rounds_allowed: int) -> Look:
    """The sequential rule after ``len(log_ratios)`` rounds of at most ``rounds_allowed``: no look
    before ``MIN_AB_ROUNDS`` rounds; from then on, judge at the per-look levels and stop once
    the verdict is "slower" or "no significant change", or when the rounds allowed are done."""
    k = len(log_ratios)
    if k < MIN_AB_ROUNDS:
        return Look(k, None, k >= rounds_allowed)
    last = k >= rounds_allowed
    judgement = judge_rounds(log_ratios, max_slowdown, more=last)
    return Look(k, judgement, judgement.decided or last)


def decide(log_ratios: Sequence[float], max_slowdown: float, rounds_allowed: int) -> Look:
    """The gate's outcome on a whole sequence of rounds, as the gate would have stopped: the
    first look that stops (the rounds after it are never run by the gate)."""
    if rounds_allowed < MIN_AB_ROUNDS:
        raise ValueError(f"the gate needs at least {MIN_AB_ROUNDS} rounds, got {rounds_allowed}")
    for k in range(1, min(len(log_ratios), rounds_allowed) + 1):
        step = look(log_ratios[:k], max_slowdown, rounds_allowed)
        if step.stop:
            return step
    return look(log_ratios, max_slowdown, rounds_allowed)
