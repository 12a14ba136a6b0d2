"""The comparison's decision rule tested as statistics: simulated histories of identical runs
and of real slowdowns, judged by the very functions the gate and the notebook use.

Each history: ``history`` earlier runs of one configuration (the gate's baseline is the last
``BASELINE`` quiet ones; all the quiet ones estimate the noise, as the store's runs of a
configuration do) and one candidate run, ~10 ms median steps, lognormal run-to-run noise of
``sigma``; every run is made on a busy machine with probability 10% (and then 20-60% slower,
flagged busy as the host sampler flags it), and 3% of the runs are 5-20% slower with nothing to
show why (hidden interference). The noise model knows only the default prior
(``DEFAULT_NOISE_AT_10MS`` = 8%) and the configuration's own runs.

Measured here at the defaults (FALSE_ALARM_RATE 0.005, MISS_RATE 0.10, 2,000 histories each),
``check``'s one-sided question against a 10% slowdown:

======= ====== ============ ============= ============== ===================
history sigma  false alarms "not slower"  caught at +20% +20% "not slower"
======= ====== ============ ============= ============== ===================
5 runs  3%     0.05%        48%           12%            0%
5 runs  5%     0.1%         41%           13%            0.1%
5 runs  8%     0.15%        35%           13%            1.0%
20 runs 3%     0.95%        73%           77%            0%
20 runs 5%     0.7%         53%           47%            0.05%
20 runs 8%     0.85%        38%           23%            0.95%
======= ====== ============ ============= ============== ===================

``check --runs 3`` (the job trains three times; their mean is judged, their own scatter joins
the noise; a busy run among them counts the three as busy):

======= ====== ============ ============= ============== ==============
history sigma  false alarms "not slower"  caught at +10% caught at +20%
======= ====== ============ ============= ============== ==============
5 runs  3%     0%           89%           6%             88%
5 runs  5%     0.05%        74%           8%             69%
5 runs  8%     0.25%        56%           8%             43%
20 runs 3%     0.1%         94%           49%            99%
20 runs 5%     0.15%        81%           27%            89%
20 runs 8%     0.2%         58%           12%            56%
======= ====== ============ ============= ============== ==============

A young configuration is judged mostly against the default, which takes the noisy end of this
machine class (identical jobs 8.8% apart over minutes): few false alarms, and little power
until its own runs say the machine is quieter than that. One run against a baseline cannot be
both careful and sensitive at this noise: the A/B gate (``python -m traceml_nb ab``,
tests/unit/test_paired.py) pairs the runs and is the CI path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from traceml_nb.analysis.judge import NO_CHANGE, SLOWER
from traceml_nb.analysis.noise import RunPoint, estimate_noise, judge_change
from traceml_nb.analysis.thresholds import DEFAULT_MAX_SLOWDOWN

BASELINE = 5
HISTORIES = 2000
BUSY_SHARE, HIDDEN_SHARE = 0.10, 0.03


def _run(rng: np.random.Generator, sigma: float, shift: float) -> tuple[float, bool]:
    """One run's median step (ms) and whether the machine was busy."""
    median = 10.0 * (1 + shift) * math.exp(rng.normal(0.0, sigma))
    if rng.random() < HIDDEN_SHARE:
        median *= 1 + rng.uniform(0.05, 0.20)
    busy = bool(rng.random() < BUSY_SHARE)
    if busy:
        median *= 1 + rng.uniform(0.20, 0.60)
    return median, busy


def outcomes(
    sigma: float, shift: float, history: int = BASELINE, histories: int = HISTORIES, seed: int = 7
) -> dict:
    """The share of each verdict over ``histories`` simulated gate decisions, each after
    ``history`` quiet runs of the configuration: one run judged (:func:`outcomes_of_runs`)."""
    return outcomes_of_runs(sigma, shift, history, 1, histories, seed)


@pytest.mark.parametrize("history", [BASELINE, 20])
@pytest.mark.parametrize("sigma", [0.03, 0.05, 0.08])
def test_identical_histories_raise_at_most_one_false_alarm_in_a_hundred(sigma, history):
    result = outcomes(sigma, 0.0, history)
    assert result.get(SLOWER, 0.0) <= 0.01 * (1.5 if sigma > 0.05 else 1.0)
    assert result.get(NO_CHANGE, 0.0) >= 0.3  # a third of identical runs are cleared, or more


def test_own_runs_outweigh_the_default_as_they_come():
    """The quieter the machine shows itself to be over more runs, the more identical runs are
    cleared: the default is a prior, not a floor."""
    young, old = outcomes(0.03, 0.0, BASELINE), outcomes(0.03, 0.0, 20)
    assert old[NO_CHANGE] >= young[NO_CHANGE] + 0.15


@pytest.mark.parametrize(("sigma", "least"), [(0.03, 0.7), (0.05, 0.4), (0.08, 0.18)])
def test_a_20pct_slowdown_is_caught_more_often_the_quieter_the_machine(sigma, least):
    young = outcomes(sigma, 0.20, BASELINE, histories=1000)
    old = outcomes(sigma, 0.20, 20, histories=1000)
    assert old.get(SLOWER, 0.0) >= least
    assert old.get(SLOWER, 0.0) > young.get(SLOWER, 0.0)  # more runs, more power
    for result in (young, old):  # and almost never let through as "not slower"
        assert result.get(NO_CHANGE, 0.0) <= 0.015


def outcomes_of_runs(
    sigma: float,
    shift: float,
    history: int,
    k: int,
    histories: int = HISTORIES,
    seed: int = 7,
    machine: Callable[[np.random.Generator], list[RunPoint]] | None = None,
) -> dict:
    """Simulated gate decisions for ``check --runs k``: ``k`` candidate runs judged together (their
    quiet ones where there are any: a busy run is left out, as from a baseline), their scatter
    a group of the noise of its own (a changed configuration); ``machine`` draws the runs of
    the machine class's other configurations for each decision (None: none)."""
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for _ in range(histories):
        runs = [_run(rng, sigma, 0.0) for _ in range(history * 2)]
        quiet = [m for m, busy in runs if not busy][-history:]
        others = machine(rng) if machine is not None else ()
        candidates = [_run(rng, sigma, shift) for _ in range(k)]
        medians = [m for m, busy in candidates if not busy] or [m for m, _ in candidates]
        noise = estimate_noise([quiet, medians], 10.0, others)
        verdict = judge_change(
            quiet[-BASELINE:],
            medians,
            noise,
            DEFAULT_MAX_SLOWDOWN,
            one_sided=True,
            after_busy=all(busy for _, busy in candidates),
        ).verdict
        counts[verdict] = counts.get(verdict, 0) + 1
    return {key: v / histories for key, v in counts.items()}


@pytest.mark.parametrize("sigma", [0.03, 0.05, 0.08])
def test_three_runs_together_keep_false_alarms_rare_and_clear_most_identical_runs(sigma):
    for history in (BASELINE, 20):
        result = outcomes_of_runs(sigma, 0.0, history, 3, histories=1000)
        assert result.get(SLOWER, 0.0) <= 0.01
        assert result.get(NO_CHANGE, 0.0) >= 0.5


@pytest.mark.parametrize(("sigma", "least"), [(0.03, 0.95), (0.05, 0.8), (0.08, 0.45)])
def test_three_runs_together_catch_a_20pct_slowdown(sigma, least):
    """The issue's target for the stored-baseline gate, +20% caught in 80% or more, met at 5%
    noise once the configuration has 20 runs, by judging three runs of the job together."""
    one = outcomes(sigma, 0.20, 20, histories=1000)
    three = outcomes_of_runs(sigma, 0.20, 20, 3, histories=1000)
    assert three.get(SLOWER, 0.0) >= least
    assert three.get(SLOWER, 0.0) > one.get(SLOWER, 0.0) + 0.2
    assert three.get(NO_CHANGE, 0.0) <= 0.01


def test_a_2x_speed_up_is_faster_from_a_single_earlier_run():
    """The demo's DataLoader fix, judged with nothing but the default noise."""
    noise = estimate_noise([], 20.0)
    assert judge_change([31.8], [12.4], noise, 0.10).verdict == "faster"
    assert judge_change([31.8], [31.0], noise, 0.10).verdict in (NO_CHANGE, "inconclusive")


#: The scatter of runs of fresh processes measured on this VM class (thresholds.py's
#: SESSION_NOISE: 8.7% between runs of one process, 12.6-14.6% between runs of 30 processes).
BETWEEN = 0.133


def test_one_run_of_another_session_is_judged_with_the_wider_noise():
    """The demo's second run in CI: one earlier run of the configuration, in another process,
    28.1 ms against 17.9 ms now, and another configuration with two runs that agreed (a
    sleep-bound loop). Judged as runs of one session it read "faster"; across sessions it is
    inconclusive, and the demo's DataLoader fix (31.8 ms → 12.4 ms) still reads faster."""
    steady = [RunPoint("starved", 39.5), RunPoint("starved", 39.6)]
    for across, verdict in ((False, "faster"), (True, "inconclusive")):
        noise = estimate_noise([], 17.9, steady, own_configs=["fixed"], across_sessions=across)
        assert noise.across_sessions is across
        assert judge_change([28.1], [17.9], noise, 0.10).verdict == verdict
    noise = estimate_noise([], 20.0, across_sessions=True)
    assert judge_change([31.8], [12.4], noise, 0.10).verdict == "faster"


def test_runs_of_other_sessions_are_rarely_called_different():
    """2,000 pairs of identical runs in two processes (``BETWEEN``, and 3% of runs 5-20% slower
    with nothing to show why), one against the other as the notebook compares a run with its
    configuration's one earlier run: "faster" or "slower" at most 1 in 200."""
    rng = np.random.default_rng(11)
    noise = estimate_noise([], 20.0, across_sessions=True)
    wrong = 0
    for _ in range(HISTORIES):
        before, after = (
            20.0 * math.exp(rng.normal(0.0, BETWEEN)) * (1 + hidden)
            for hidden in np.where(rng.random(2) < HIDDEN_SHARE, rng.uniform(0.05, 0.20, 2), 0)
        )
        wrong += judge_change([before], [after], noise, 0.10).verdict in ("faster", "slower")
    assert wrong / HISTORIES <= 0.005


def _other_configurations(
    rng: np.random.Generator, sigmas: list[float], two_workloads: bool = False
) -> list[RunPoint]:
    """Runs of other configurations of the machine class, one at each run noise of
    ``sigmas``: steps of 5 to 20 ms, 2 to 6 quiet runs each, with the hidden interference of
    :func:`_run`; with ``two_workloads``, the first one's every other run 2x as long (a script
    run with other arguments under one key)."""
    points = []
    for c, sigma in enumerate(sigmas):
        base = 10.0 * math.exp(rng.uniform(-0.7, 0.7))
        for i in range(int(rng.integers(2, 7))):
            median = base * math.exp(rng.normal(0.0, sigma))
            if rng.random() < HIDDEN_SHARE:
                median *= 1 + rng.uniform(0.05, 0.20)
            if two_workloads and c == 0 and i % 2:
                median *= 2.0
            points.append(RunPoint(f"c{c}", median))
    return points


def _left_out_share(sigma: float, two_workloads: bool, histories: int) -> float:
    rng = np.random.default_rng(5)
    left_out = 0
    for _ in range(histories):
        own = [[_run(rng, sigma, 0.0)[0] for _ in range(BASELINE)]]
        machine = _other_configurations(rng, [sigma] * 5, two_workloads)
        left_out += estimate_noise(own, 10.0, machine).class_left_out > 0
    return left_out / histories


@pytest.mark.parametrize("sigma", [0.03, 0.08])
def test_other_configurations_of_identical_runs_are_kept(sigma):
    """1,000 machine classes of five configurations, each of identical runs: one of them is
    left out of the noise in at most 1 in 100 (measured over 2,000: 0.1% at 3% noise, 0.2% at
    5%, 0.4% at 8%; 1.3% at 15%, which the 8% default disagrees with most)."""
    assert _left_out_share(sigma, False, 1000) <= 0.01


@pytest.mark.parametrize("sigma", [0.03, 0.05])
def test_a_configuration_of_two_workloads_is_left_out(sigma):
    """...and one of them two workloads 2x apart is left out in at least 95 in 100 (measured
    over 1,000: 99.5% at 3% noise, 98.6% at 5%; 94% at 8%, 47% at 15%, where 2x is less far
    beyond the machine's own noise)."""
    assert _left_out_share(sigma, True, 300) >= 0.95


def test_a_class_of_noisier_and_quieter_configurations_keeps_false_alarms_rare():
    """The F test also leaves out a configuration that is only noisier than the rest (one
    whose workers contend: the quickstart's fixed cell on a slow hour, 18-40 ms), so the class
    prior narrows where the machine's configurations differ in noise. 2,000 gate decisions as
    :func:`outcomes` makes them, at 8% noise, beside five other configurations at 3%, 8% or
    15% each: false alarms at most 1.5 in 100, the bound above (measured 0.45%; 0.25% with no
    configuration ever left out)."""

    def machine(rng: np.random.Generator) -> list[RunPoint]:
        return _other_configurations(rng, list(rng.choice([0.03, 0.08, 0.15], 5)))

    result = outcomes_of_runs(0.08, 0.0, BASELINE, 1, seed=1, machine=machine)
    assert result.get(SLOWER, 0.0) <= 0.015


def test_a_noisier_configuration_is_not_judged_by_quieter_ones():
    """A configuration whose runs scatter 15% (the quickstart's fixed cell, its workers
    contending for two cores), 7 runs, beside three quieter ones (3%, 5%, 5%): 2,000 gate
    decisions of identical runs. Counted, the quieter configurations narrowed its noise: 2.95%
    false alarms; set aside where its own runs scatter more (``OWN_NOISIER_LEVEL``), 1.6%."""

    def machine(rng: np.random.Generator) -> list[RunPoint]:
        return _other_configurations(rng, [0.03, 0.05, 0.05])

    result = outcomes_of_runs(0.15, 0.0, 7, 1, seed=1, machine=machine)
    assert result.get(SLOWER, 0.0) <= 0.02


def test_configurations_that_scatter_alike_still_lend_their_runs():
    """...and where the configurations scatter alike (5% each, five of them) they still count
    toward a young configuration's noise: +20% caught in 40% of 2,000 gates after 5 runs
    (43% with the other configurations never set aside, 14% with them never counted)."""

    def machine(rng: np.random.Generator) -> list[RunPoint]:
        return _other_configurations(rng, [0.05] * 5)

    result = outcomes_of_runs(0.05, 0.20, BASELINE, 1, seed=1, machine=machine)
    assert result.get(SLOWER, 0.0) >= 0.35


def _levels_decision(quiet: list[float], candidate: float, margin: float, one_sided: bool) -> str:
    """One run judged as :mod:`traceml_nb.session.baselines` judges it: the noise pools the
    levels of its configuration's runs, each around its own mean; the baseline is the last
    ``BASELINE`` runs of the level a new run is judged against."""
    from traceml_nb.analysis.levels import baseline_level, by_level, run_levels

    levels = run_levels(quiet, 10.0)
    noise = estimate_noise(by_level(quiet, levels), 10.0)
    chosen = baseline_level(levels)
    baseline = [m for m, level in zip(quiet, levels, strict=True) if level == chosen]
    return judge_change(
        baseline[-BASELINE:], [candidate], noise, margin, one_sided=one_sided
    ).verdict


def level_outcomes(
    sigma: float, history: int, shifts: list[float], shift: float, histories: int, seed: int = 7
) -> dict:
    """Verdicts on one run ``shift`` slower than ``history`` quiet runs (the gate's noise, one
    in ten runs busy and left out, 3% hidden interference), after later quiet runs at
    ``shifts`` (a change no setting shows); the gate's one-sided question where nothing
    shifted, the report's two-sided one with ``CHANGE_MARGIN`` where something did."""
    from traceml_nb.analysis.thresholds import CHANGE_MARGIN

    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for _ in range(histories):
        runs = [_run(rng, sigma, 0.0) for _ in range(history * 2)]
        quiet = [m for m, busy in runs if not busy][-history:]
        quiet += [10.0 * (1 + s) * math.exp(rng.normal(0.0, sigma)) for s in shifts]
        candidate = 10.0 * (1 + shift) * math.exp(rng.normal(0.0, sigma))
        margin, one_sided = (CHANGE_MARGIN, False) if shifts else (DEFAULT_MAX_SLOWDOWN, True)
        verdict = _levels_decision(quiet, candidate, margin, one_sided)
        counts[verdict] = counts.get(verdict, 0) + 1
    return {key: v / histories for key, v in counts.items()}


@pytest.mark.parametrize("sigma", [0.03, 0.08])
def test_levels_keep_identical_histories_false_alarms_as_rare(sigma):
    """Splitting a configuration's runs into levels (two runs in a row decided apart) leaves
    identical histories as they were: measured at 2,000 histories, the same false alarms and
    "not slower" shares as the pooled noise (0.4% and 42% at 8%, 20 runs)."""
    result = level_outcomes(sigma, 20, [], 0.0, histories=600)
    assert result.get(SLOWER, 0.0) <= 0.01 * (1.5 if sigma > 0.05 else 1.0)
    assert result.get(NO_CHANGE, 0.0) >= 0.3


@pytest.mark.parametrize(("sigma", "least"), [(0.01, 0.75), (0.03, 0.3)])
def test_a_lasting_slowdown_is_caught_on_its_second_and_third_runs(sigma, least):
    """Five runs, then one or two 27% slower with nothing to show why, then another: caught as
    slower about as often as the first slow run was (measured at 500 histories: 86% and 88% at
    1% noise, 43% and 44% at 3%, where the first run's was 89% and 63%); pooled as one level,
    never (0% and 0%: the slow runs widened the noise past the change)."""
    for slow in (1, 2):
        result = level_outcomes(sigma, 5, [0.27] * slow, 0.27, histories=300)
        assert result.get(SLOWER, 0.0) >= least, (slow, result)
