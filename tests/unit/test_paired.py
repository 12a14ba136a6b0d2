"""The A/B gate's decision (:mod:`traceml_nb.analysis.paired`): the pure rule on both sides of
each constant, and the simulation study its defaults were chosen by.

The study: 10,000 simulated A/B decisions per case at the defaults (``DEFAULT_AB_ROUNDS`` = 30,
``MIN_AB_ROUNDS`` = 5, ``AB_FALSE_ALARM_PER_LOOK`` = 0.001, ``AB_MISS_PER_LOOK`` = 0.03,
``--max-slowdown`` 0.10). Each decision is one CI job: a ~10 ms step; each run's median carries
lognormal noise of sigma 3-8% (drawn per job); a slow drift across the job (a linear trend of up
to ±15% plus a slow swing of up to ±5%); busy spells: each run starts one with probability 4%,
lasting 1-3 runs, 20-60% slower (ABBA puts two head runs side by side, so a spell can hit two
rounds the same way). Measured with seed 20261202:

=====================  ==========  ============  ==================  ===========
case                   slower (1)  not slower    inconclusive (3)    mean rounds
=====================  ==========  ============  ==================  ===========
identical code         0.25%       98.2%         1.5%                8.3
+5% (indifference)     18.7%       70.1%         11.2%               13.9
+10%                   81.7%       9.6%          8.7%                14.6
+20%                   99.9%       0.04%         0.07%               8.4
=====================  ==========  ============  ==================  ===========

On the noisiest machine of the study (sigma 8% on every run) identical code is called slower in
0.49% of jobs, +10% is caught in 68% and +20% in 99.6% (10.5, 18.9 and 10.5 rounds). The rule is vectorised here with numpy (the same formulas as
:func:`traceml_nb.analysis.judge.judge`, with the t quantiles of :mod:`~traceml_nb.analysis.
stats`); ``test_the_vectorised_rule_is_the_rule`` checks it against
:func:`~traceml_nb.analysis.paired.decide` itself on simulated jobs of every outcome.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from traceml_nb.analysis.judge import FALSE_ALARM_RATE, INCONCLUSIVE, NO_CHANGE, SLOWER
from traceml_nb.analysis.paired import (
    decide,
    judge_rounds,
    log_ratio,
    look,
    round_order,
)
from traceml_nb.analysis.stats import t_quantile
from traceml_nb.analysis.thresholds import (
    AB_FALSE_ALARM_PER_LOOK,
    AB_MISS_PER_LOOK,
    DEFAULT_AB_ROUNDS,
    DEFAULT_MAX_SLOWDOWN,
    MIN_AB_ROUNDS,
)

MARGIN = DEFAULT_MAX_SLOWDOWN
SEED = 20261202


def _alternating(mean: float, half_width: float, k: int, level: float) -> list[float]:
    """``k`` (even) ratios around ``mean`` whose one-sided bound at ``level`` lies exactly
    ``half_width`` from the mean: ±c alternating, c chosen so that t·sd/sqrt(k) = half_width."""
    assert k % 2 == 0
    t = t_quantile(level, k - 1)
    sd = half_width / t * math.sqrt(k)
    c = sd / math.sqrt(k / (k - 1))  # the sample sd of ±c (k - 1 in the denominator)
    return [mean + (c if i % 2 else -c) for i in range(k)]


# --- the pure rule ---------------------------------------------------------------------------
def test_log_ratio_and_the_abba_order():
    assert log_ratio(10.0, 12.0) == pytest.approx(math.log(1.2))
    with pytest.raises(ValueError):
        log_ratio(0.0, 12.0)
    assert [round_order(i) for i in (1, 2, 3, 4)] == [
        ("A", "B"),
        ("B", "A"),
        ("A", "B"),
        ("B", "A"),
    ]
    with pytest.raises(ValueError):
        round_order(0)


def test_no_look_before_min_rounds_and_a_look_from_then_on():
    twice_as_slow = [math.log(2.0) + 0.01 * (-1) ** i for i in range(MIN_AB_ROUNDS)]
    early = look(twice_as_slow[:-1], MARGIN, DEFAULT_AB_ROUNDS)
    assert early.judgement is None and not early.stop
    first = look(twice_as_slow, MARGIN, DEFAULT_AB_ROUNDS)
    assert first.judgement is not None and first.judgement.verdict == SLOWER and first.stop
    assert decide(twice_as_slow * 3, MARGIN, DEFAULT_AB_ROUNDS).rounds == MIN_AB_ROUNDS
    with pytest.raises(ValueError):
        decide(twice_as_slow, MARGIN, MIN_AB_ROUNDS - 1)


def test_the_false_alarm_level_per_look_on_both_sides():
    level = 1 - AB_FALSE_ALARM_PER_LOOK
    mean = math.log(1.3)
    just_sure = _alternating(mean, mean * 0.99, 6, level)
    just_unsure = _alternating(mean, mean * 1.01, 6, level)
    assert judge_rounds(just_sure, MARGIN).verdict == SLOWER
    unsure = judge_rounds(just_unsure, MARGIN)
    assert unsure.verdict == INCONCLUSIVE
    assert unsure.bound(AB_FALSE_ALARM_PER_LOOK) == pytest.approx(unsure.low)
    assert unsure.low < 0 < judge_rounds(just_sure, MARGIN).bound(AB_FALSE_ALARM_PER_LOOK)
    # one comparison's level would have called it: the sequential gate asks for more per look
    assert judge_rounds(just_unsure, MARGIN, false_alarm_rate=FALSE_ALARM_RATE).verdict == SLOWER


def test_the_miss_level_per_look_on_both_sides():
    level = 1 - AB_MISS_PER_LOOK
    log_margin = math.log1p(MARGIN)
    ruled_out = _alternating(0.0, log_margin * 0.99, 8, level)
    not_ruled_out = _alternating(0.0, log_margin * 1.01, 8, level)
    judged = judge_rounds(ruled_out, MARGIN)
    assert judged.verdict == NO_CHANGE
    assert judged.bound(level) == pytest.approx(MARGIN * 0.99, rel=0.02)
    assert judge_rounds(not_ruled_out, MARGIN).verdict == INCONCLUSIVE
    # the single-comparison miss rate (10%) would have passed it
    assert judge_rounds(not_ruled_out, MARGIN, miss_rate=0.10).verdict == NO_CHANGE


def test_half_the_margin_is_the_least_slowdown_called_slower():
    half = math.log1p(MARGIN / 2)
    tight = [0.001 * (-1) ** i for i in range(6)]
    assert judge_rounds([half * 1.02 + x for x in tight], MARGIN).verdict == SLOWER
    below = judge_rounds([half * 0.98 + x for x in tight], MARGIN)
    assert below.verdict == NO_CHANGE  # confidently slower, but by less than half: passes


def test_a_faster_head_is_not_slower_one_sided():
    faster = [math.log(0.6) + 0.05 * (-1) ** i for i in range(MIN_AB_ROUNDS + 1)]
    judged = judge_rounds(faster, MARGIN)
    assert judged.one_sided and judged.verdict == NO_CHANGE and judged.change < -0.35


def test_the_rounds_allowed_end_the_gate_inconclusive_with_the_rounds_that_would_decide():
    noisy = _alternating(math.log(1.07), math.log(1.07) * 1.6, 10, 1 - AB_FALSE_ALARM_PER_LOOK)
    stopped = decide(noisy, MARGIN, 10)
    assert stopped.rounds == 10 and stopped.stop
    assert stopped.judgement is not None and stopped.judgement.verdict == INCONCLUSIVE
    more = stopped.judgement.more_needed
    assert more is not None and more > 0
    # with that many more rounds like these, it is decided
    c = noisy[1] - math.log(1.07)
    longer = [math.log(1.07) + (c if i % 2 else -c) for i in range(10 + more + (more % 2))]
    assert judge_rounds(longer, MARGIN).decided
    # one round before the end: no stop yet, and no search for the rounds that would decide
    before = look(noisy[:9], MARGIN, 10)
    assert not before.stop and before.judgement is not None
    assert before.judgement.more_needed is None
    with pytest.raises(ValueError):
        judge_rounds([0.1], MARGIN)


# --- the simulation study --------------------------------------------------------------------
def simulate_jobs(
    rng: np.random.Generator,
    n: int,
    rounds: int,
    effect: float,
    *,
    sigma: tuple[float, float] = (0.03, 0.08),
    busy_start: float = 0.04,
) -> np.ndarray:
    """``n`` simulated A/B jobs of ``rounds`` rounds: the paired log ratios ln(B/A), shape
    (n, rounds), B ``effect`` slower (0.1 = 10%). Noise model in the module docstring."""
    runs = 2 * rounds
    position = np.arange(runs) / (runs - 1)
    slope = rng.uniform(-0.15, 0.15, size=(n, 1))
    swing = rng.uniform(0, 0.05, size=(n, 1))
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1))
    drift = slope * position + swing * np.sin(2 * np.pi * position + phase)
    noise = rng.uniform(*sigma, size=(n, 1)) * rng.standard_normal((n, runs))
    starts = rng.random((n, runs)) < busy_start
    length = rng.integers(1, 4, size=(n, runs))
    slower = np.log(rng.uniform(1.2, 1.6, size=(n, runs)))
    busy = np.zeros((n, runs))
    for lag in range(3):  # a spell started at run i covers runs i .. i + length - 1
        hit = np.where(starts & (length > lag), slower, 0.0)
        busy[:, lag:] = np.maximum(busy[:, lag:], hit[:, : runs - lag])
    log_step = math.log(10.0) + drift + noise + busy
    r = np.arange(rounds)
    a_at = np.where(r % 2 == 0, 2 * r, 2 * r + 1)  # ABBA: odd rounds (1-based) A first
    b_at = np.where(r % 2 == 0, 2 * r + 1, 2 * r)
    return log_step[:, b_at] + math.log1p(effect) - log_step[:, a_at]


def gate_vectorised(d: np.ndarray, rounds_allowed: int) -> tuple[np.ndarray, np.ndarray]:
    """The gate on each row of ``d``: its verdict (SLOWER, NO_CHANGE or INCONCLUSIVE) and the
    rounds it used. judge's rule, one-sided, at the per-look levels, looking from
    ``MIN_AB_ROUNDS`` on and stopping at the first decided look."""
    n = d.shape[0]
    verdict = np.full(n, INCONCLUSIVE, dtype=object)
    used = np.full(n, rounds_allowed)
    open_ = np.ones(n, dtype=bool)
    log_margin, half = math.log1p(MARGIN), math.log1p(MARGIN / 2)
    for k in range(MIN_AB_ROUNDS, rounds_allowed + 1):
        mean = d[:, :k].mean(axis=1)
        se = d[:, :k].std(axis=1, ddof=1) / math.sqrt(k)
        sure = t_quantile(1 - AB_FALSE_ALARM_PER_LOOK, k - 1) * se
        fair = t_quantile(1 - AB_MISS_PER_LOOK, k - 1) * se
        slower = (mean - sure > 0) & (mean >= half)
        not_slower = ~slower & (mean + fair < log_margin)
        for name, hit in ((SLOWER, slower), (NO_CHANGE, not_slower)):
            new = open_ & hit
            verdict[new] = name
            used[new] = k
            open_ &= ~new
    return verdict, used


def test_the_vectorised_rule_is_the_rule():
    rng = np.random.default_rng(SEED + 1)
    rows = [simulate_jobs(rng, 40, 12, effect) for effect in (0.0, 0.07, 0.10, 0.3)]
    d = np.vstack(rows)
    verdicts, used = gate_vectorised(d, 12)
    assert {SLOWER, NO_CHANGE, INCONCLUSIVE} <= set(verdicts)  # every outcome is checked
    for row, verdict, k in zip(d, verdicts, used, strict=True):
        outcome = decide([float(x) for x in row], MARGIN, 12)
        assert outcome.judgement is not None
        assert (outcome.judgement.verdict, outcome.rounds) == (verdict, k)


def _study(effect: float, n: int = 10_000, **noise: object) -> dict[str, float]:
    rng = np.random.default_rng(SEED)
    d = simulate_jobs(rng, n, DEFAULT_AB_ROUNDS, effect, **noise)  # type: ignore[arg-type]
    verdicts, used = gate_vectorised(d, DEFAULT_AB_ROUNDS)
    return {
        "slower": float(np.mean(verdicts == SLOWER)),
        "not slower": float(np.mean(verdicts == NO_CHANGE)),
        "inconclusive": float(np.mean(verdicts == INCONCLUSIVE)),
        "rounds": float(used.mean()),
    }


def test_identical_code_is_called_slower_in_at_most_one_percent_of_jobs():
    identical = _study(0.0)
    print("identical", identical)
    assert identical["slower"] <= 0.01
    assert identical["not slower"] >= 0.95  # and it usually says so, in few rounds
    assert identical["rounds"] <= 12
    noisiest = _study(0.0, sigma=(0.08, 0.08))
    print("identical, sigma 8%", noisiest)
    assert noisiest["slower"] <= 0.01


def test_the_gate_catches_ten_and_twenty_percent():
    ten, twenty = _study(0.10), _study(0.20)
    print("+10%", ten, "+20%", twenty)
    assert ten["slower"] >= 0.80
    assert twenty["slower"] >= 0.95
    assert twenty["rounds"] <= 12
