"""The decision rule every comparison of step times uses: a change, its noise, a verdict.

A change is the log ratio of median step times, ``delta`` = ln(after / before), estimated
with a standard error ``se`` on ``df`` degrees of freedom (Student's t): from the run-to-run
noise of configurations (:mod:`.noise`: a run or runs against a baseline), or from the paired
per-round ratios of an A/B gate (:mod:`.paired`). Against a ``margin`` (the least change that
matters, a fraction: ``CHANGE_MARGIN`` in the notebook, ``--max-slowdown`` in a gate):

* **slower**: the lower bound at ``1 - FALSE_ALARM_RATE`` is above 0 (confidently slower)
  **and** the estimate is at least half the margin (nearer the margin than no change);
* **faster**: the same, mirrored;
* **no significant change**: both bounds at ``1 - MISS_RATE`` lie within ± the margin: a change
  of the margin is ruled out (for a gate, only the upper bound counts: *not slower*);
* **inconclusive** otherwise, with how many more runs (or rounds) would decide, were the
  estimate and the noise to stay as they are.

Between half the margin and the margin lies the indifference zone: a gate built to catch a
+10% slowdown catches +10% with probability ≥ 1 − ``MISS_RATE`` and calls identical code
slower with probability ≤ ``FALSE_ALARM_RATE``; a +6% slowdown may go either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .stats import t_quantile
from .thresholds import FALSE_ALARM_RATE, MAX_RUNS_NEEDED, MISS_RATE

FASTER, SLOWER, NO_CHANGE, INCONCLUSIVE = (
    "faster",
    "slower",
    "no significant change",
    "inconclusive",
)
VERDICTS = (FASTER, SLOWER, NO_CHANGE, INCONCLUSIVE)


@dataclass(frozen=True)
class Judgement:
    """A change of the median step time, judged.

    ``change`` the best estimate, relative (0.12 = 12% slower); ``low``/``high`` its confidence
    bounds at ``1 - FALSE_ALARM_RATE`` each side (relative); ``verdict`` one of
    :data:`VERDICTS`; ``margin`` the least change that matters (a fraction); ``one_sided``:
    a gate's question (is it slower?), where a faster run is *no significant change*;
    ``se`` the standard error of the log change and ``df`` its degrees of freedom;
    ``more_needed``: for an inconclusive verdict, how many more runs (or rounds) would decide
    were the estimate and the noise to stay as they are (None: decided, or more than
    ``MAX_RUNS_NEEDED``).
    """

    change: float
    low: float
    high: float
    verdict: str
    margin: float
    se: float
    df: float
    one_sided: bool = False
    more_needed: int | None = None

    @property
    def decided(self) -> bool:
        return self.verdict != INCONCLUSIVE

    @property
    def half_width(self) -> float:
        """The bounds' distance from the estimate, relative (0.074: ±7.4%)."""
        return math.expm1(math.log1p(self.high) - math.log1p(self.change))

    def bound(self, level: float) -> float:
        """The one-sided bound of the change (relative) at confidence ``level``: above 0.5 an
        upper bound (0.90: the bound a "no significant change" at ``MISS_RATE`` = 0.10 puts
        below the margin), below it a lower bound (0.005: the bound a "slower" puts above 0)."""
        t = t_quantile(level, self.df) if self.se > 0 else 0.0
        return math.expm1(math.log1p(self.change) + t * self.se)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _verdict(
    delta: float,
    se: float,
    df: float,
    margin: float,
    one_sided: bool,
    false_alarm_rate: float,
    miss_rate: float,
) -> str:
    """The verdict on a log change ``delta`` with standard error ``se`` on ``df`` degrees of
    freedom, against ``margin`` (module docstring)."""
    log_margin = math.log1p(margin)
    half = math.log1p(margin / 2)
    sure = t_quantile(1 - false_alarm_rate, df) * se
    if delta - sure > 0 and delta >= half:
        return SLOWER
    if not one_sided and delta + sure < 0 and delta <= -half:
        return FASTER
    fair = t_quantile(1 - miss_rate, df) * se
    within_above = delta + fair < log_margin
    if within_above and (one_sided or delta - fair > -log_margin):
        return NO_CHANGE
    return INCONCLUSIVE


def judge(
    delta: float,
    se: float,
    df: float,
    margin: float,
    *,
    one_sided: bool = False,
    se_with_more: Callable[[int], tuple[float, float]] | None = None,
    false_alarm_rate: float = FALSE_ALARM_RATE,
    miss_rate: float = MISS_RATE,
) -> Judgement:
    """Judge the log change ``delta`` (ln after/before) with standard error ``se`` on ``df``
    degrees of freedom against ``margin`` (module docstring). ``se_with_more(m)``: the
    standard error and degrees of freedom ``m`` more runs would give, for the count an
    inconclusive verdict carries. ``false_alarm_rate`` and ``miss_rate``: the one-sided levels
    of the two bounds (a sequential gate that looks after every round asks for less per look)."""
    if se < 0 or df <= 0 or margin <= 0:
        raise ValueError(f"judge needs se >= 0, df > 0, margin > 0 (got {se}, {df}, {margin})")
    levels = (false_alarm_rate, miss_rate)
    verdict = _verdict(delta, se, df, margin, one_sided, *levels)
    sure = t_quantile(1 - false_alarm_rate, df) * se
    more = None
    if verdict == INCONCLUSIVE and se_with_more is not None:
        for m in range(1, MAX_RUNS_NEEDED + 1):
            se_m, df_m = se_with_more(m)
            if _verdict(delta, se_m, df_m, margin, one_sided, *levels) != INCONCLUSIVE:
                more = m
                break
    return Judgement(
        change=math.expm1(delta),
        low=math.expm1(delta - sure),
        high=math.expm1(delta + sure),
        verdict=verdict,
        margin=margin,
        se=se,
        df=df,
        one_sided=one_sided,
        more_needed=more,
    )
