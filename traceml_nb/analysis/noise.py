"""Run-to-run noise: how far identical runs' median step times scatter, and how well we know it.

The unit of noise is a *configuration* (:mod:`.configuration`): runs of one configuration
(same name, hardware class, code, DataLoader settings, versions) differ only by the machine's
noise, so the scatter of their log median step times estimates it; runs of different
configurations never do. With few runs that estimate is itself uncertain, so it is

* **pooled** over the configurations a comparison involves (each configuration's runs around
  their own mean: a changed DataLoader shifts the mean, not the noise);
* **shrunk** toward what this machine class has shown for *other* configurations and names of a
  similar step length (within ``STEP_LENGTH_FACTOR``; at most ``CLASS_PRIOR_MAX_DF`` degrees of
  freedom of it; a configuration whose runs scatter far beyond all the rest, two workloads
  under one key, left out: ``CLASS_OUTLIER_LEVEL``; all of them set aside where the compared
  configurations' own runs scatter more: ``OWN_NOISIER_LEVEL``), and toward a documented
  default for the
  step length
  (:func:`default_noise_sigma`, worth ``DEFAULT_PRIOR_DF`` degrees of freedom): short steps
  are noisier;
* **wider across sessions**: a comparison with runs of another session (another kernel or
  job, so another process) assumes ``SESSION_NOISE`` more by default, as a process's own state
  moves all its steps (:func:`default_noise_sigma`);
* **carried with its degrees of freedom**, so that the verdict's bounds use Student's t
  (:mod:`.judge`): three runs give wide bounds, thirty narrow ones.

Runs made on a busy machine (:func:`is_busy`) do not estimate the noise (they would widen it
for every later run); a busy run being judged gets ``BUSY_NOISE_FACTOR`` times the noise.
All spreads are standard deviations of ln(median step), i.e. relative (0.05 ≈ 5%).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .judge import Judgement, judge
from .stats import f_sf
from .thresholds import (
    BUSY_MACHINE_SHARE,
    BUSY_NOISE_FACTOR,
    CLASS_OUTLIER_LEVEL,
    CLASS_PRIOR_MAX_DF,
    DEFAULT_NOISE_AT_10MS,
    DEFAULT_NOISE_EXPONENT,
    DEFAULT_NOISE_MAX,
    DEFAULT_PRIOR_DF,
    MATERIAL_STEAL_SHARE,
    OWN_NOISIER_LEVEL,
    SESSION_NOISE,
    STEP_LENGTH_FACTOR,
)
from .variants import Variant


def is_busy(load: dict[str, Any] | None) -> bool:
    """The machine was busy during a run: other processes used at least
    ``BUSY_MACHINE_SHARE`` of its CPUs, or the hypervisor took at least
    ``MATERIAL_STEAL_SHARE`` (steal time). ``load``: a run's ``other_cpu_share`` and
    ``steal_share`` (0..1; missing or None: not measured, not busy)."""
    load = load or {}
    other, steal = load.get("other_cpu_share"), load.get("steal_share")
    return (other is not None and other >= BUSY_MACHINE_SHARE) or (
        steal is not None and steal >= MATERIAL_STEAL_SHARE
    )


def default_noise_sigma(step_ms: float, across_sessions: bool = False) -> float:
    """The run-to-run noise assumed before any run says otherwise, for a median step of
    ``step_ms`` milliseconds: ``DEFAULT_NOISE_AT_10MS`` at 10 ms, growing for shorter steps
    as (10 ms / step) ** ``DEFAULT_NOISE_EXPONENT``, at most ``DEFAULT_NOISE_MAX``; with
    ``across_sessions`` (runs of different processes compared), ``SESSION_NOISE`` added in
    quadrature."""
    if step_ms <= 0 or not math.isfinite(step_ms):
        within = DEFAULT_NOISE_MAX
    else:
        scale = max(1.0, 10.0 / step_ms) ** DEFAULT_NOISE_EXPONENT
        within = min(DEFAULT_NOISE_MAX, DEFAULT_NOISE_AT_10MS * scale)
    return math.hypot(within, SESSION_NOISE) if across_sessions else within


@dataclass(frozen=True)
class RunPoint:
    """One run as the noise model reads it: its configuration key, median step (ms), whether
    the machine was busy (:func:`is_busy`) and, where known, its variant: the values that tell
    its configuration's runs apart (:func:`.variants.variant`)."""

    config: str | None
    median_ms: float
    busy: bool = False
    variant: Variant = ()


@dataclass(frozen=True)
class Noise:
    """The run-to-run noise a change is judged against.

    ``sigma``: the standard deviation of ln(median step) between identical runs (≈ relative:
    0.05 = 5%); ``df``: its degrees of freedom (own + class + default); ``own_runs``: runs of
    the compared configurations that estimated it (``own_configs`` configurations with two
    runs or more) and ``own_df`` their degrees of freedom (runs less one per configuration);
    ``class_df``: what other configurations of the machine
    class gave (``class_configs`` of them; ``class_left_out`` more were left out, their runs
    scattered beyond the machine's noise; ``class_set_aside`` were set aside, the compared
    configurations' own runs scattering more than theirs); ``default_df``: the default's
    weight;
    ``step_ms``: the step length the default and the class were taken at;
    ``across_sessions``: the compared runs came from different sessions (the default is then
    the wider one, :func:`default_noise_sigma`).
    """

    sigma: float
    df: float
    own_runs: int = 0
    own_df: float = 0.0
    own_configs: int = 0
    class_df: float = 0.0
    class_configs: int = 0
    class_left_out: int = 0
    class_set_aside: int = 0
    default_df: float = DEFAULT_PRIOR_DF
    step_ms: float = 0.0
    across_sessions: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pooled(groups: Sequence[Sequence[float]]) -> tuple[float, float, int, int]:
    """Sum of squared deviations of log values around each group's mean, its degrees of
    freedom (values less one per group of two or more), the values and the groups counted."""
    ss, df, values, counted = 0.0, 0.0, 0, 0
    for group in groups:
        logs = [math.log(v) for v in group if v > 0 and math.isfinite(v)]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        ss += sum((x - mean) ** 2 for x in logs)
        df += len(logs) - 1
        values += len(logs)
        counted += 1
    return ss, df, values, counted


def _class_prior(groups: Sequence[Sequence[float]]) -> tuple[float, float, int]:
    """The other configurations' sum of squares and degrees of freedom, worth at most
    ``CLASS_PRIOR_MAX_DF``, and how many configurations gave them."""
    ss, df, _, configs = _pooled(groups)
    return (*_capped(ss, df), configs)


def _capped(ss: float, df: float) -> tuple[float, float]:
    """A sum of squares and its degrees of freedom worth at most ``CLASS_PRIOR_MAX_DF``."""
    if df > CLASS_PRIOR_MAX_DF:
        return ss * CLASS_PRIOR_MAX_DF / df, CLASS_PRIOR_MAX_DF
    return ss, df


def _without_outliers(
    groups: Sequence[Sequence[float]], prior_ss: float, prior_df: float
) -> tuple[list[Sequence[float]], int]:
    """The other configurations less those whose runs scatter beyond the machine's noise, and
    how many were left out: one at a time, the one least likely to be identical runs, while
    its F test against everything else (``prior_ss`` over ``prior_df``: the default and the
    compared configurations; the other configurations kept) is below
    ``CLASS_OUTLIER_LEVEL``."""
    kept = [(group, *_pooled([group])[:2]) for group in groups]
    left_out = 0
    while kept:
        total_ss, total_df = sum(k[1] for k in kept), sum(k[2] for k in kept)
        worst, worst_p = -1, 1.0
        for i, (_, ss, df) in enumerate(kept):
            if df == 0 or ss == 0:
                continue
            rest_ss, rest_df = _capped(max(total_ss - ss, 0.0), total_df - df)
            reference = (prior_ss + rest_ss) / (prior_df + rest_df)
            p = f_sf((ss / df) / reference, df, prior_df + rest_df)
            if p < worst_p:
                worst, worst_p = i, p
        if worst_p >= CLASS_OUTLIER_LEVEL:
            break
        del kept[worst]
        left_out += 1
    return [group for group, _, _ in kept], left_out


def _scatters_more(own_ss: float, own_df: float, class_ss: float, class_df: float) -> bool:
    """The compared configurations' own runs (``own_ss`` over ``own_df``) scatter more than
    the other configurations' (``class_ss`` over ``class_df``), by an F test of the two
    variances below ``OWN_NOISIER_LEVEL``."""
    if own_df == 0 or class_df == 0 or own_ss == 0:
        return False
    if class_ss == 0:
        return True
    return f_sf((own_ss / own_df) / (class_ss / class_df), own_df, class_df) < OWN_NOISIER_LEVEL


def _by_config(points: Sequence[RunPoint]) -> dict[str | None, list[float]]:
    groups: dict[str | None, list[float]] = {}
    for p in points:
        groups.setdefault(p.config, []).append(p.median_ms)
    return groups


def estimate_noise(
    own: Sequence[Sequence[float]],
    step_ms: float,
    machine: Sequence[RunPoint] = (),
    *,
    own_configs: Sequence[str | None] = (),
    across_sessions: bool = False,
) -> Noise:
    """The noise for a comparison of runs whose median step is about ``step_ms`` ms.

    ``own``: the median step times (ms) of the compared configurations' quiet runs, one
    sequence per configuration; ``machine``: runs of other configurations on the same
    hardware class (their busy runs and the configurations in ``own_configs`` are left out),
    pooled when a configuration's (geometric) mean step is within ``STEP_LENGTH_FACTOR`` of
    ``step_ms``, worth at most
    ``CLASS_PRIOR_MAX_DF`` degrees of freedom; ``across_sessions``: the compared runs came
    from different sessions. See the module docstring."""
    own_ss, own_df, own_runs, own_groups = _pooled(own)
    skip = set(own_configs)
    quiet = [p for p in machine if not p.busy and p.config is not None and p.config not in skip]
    groups = [
        g
        for g in _by_config(quiet).values()
        if len(g) >= 2
        and step_ms > 0
        and 1 / STEP_LENGTH_FACTOR <= log_mean_ms(g) / step_ms <= STEP_LENGTH_FACTOR
    ]
    default = default_noise_sigma(step_ms, across_sessions)
    prior_ss, prior_df = DEFAULT_PRIOR_DF * default**2 + own_ss, DEFAULT_PRIOR_DF + own_df
    kept, left_out = _without_outliers(groups, prior_ss, prior_df)
    class_ss, class_df, class_configs = _class_prior(kept)
    set_aside = 0
    if _scatters_more(own_ss, own_df, class_ss, class_df):
        set_aside, class_ss, class_df, class_configs = class_configs, 0.0, 0.0, 0
    df = prior_df + class_df
    variance = (prior_ss + class_ss) / df
    return Noise(
        sigma=math.sqrt(variance),
        df=df,
        own_runs=own_runs,
        own_df=own_df,
        own_configs=own_groups,
        class_df=class_df,
        class_configs=class_configs,
        class_left_out=left_out,
        class_set_aside=set_aside,
        default_df=DEFAULT_PRIOR_DF,
        step_ms=step_ms,
        across_sessions=across_sessions,
    )


def log_mean_ms(values: Sequence[float]) -> float:
    """The geometric mean of median step times (ms): the center the verdicts use."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs))


def judge_change(
    before_ms: Sequence[float],
    after_ms: Sequence[float],
    noise: Noise,
    margin: float,
    *,
    one_sided: bool = False,
    after_busy: bool = False,
) -> Judgement:
    """The runs with median steps ``after_ms`` against those with ``before_ms`` (ms; one or
    more each), judged against ``noise`` and ``margin`` (:func:`.judge.judge`). The change is
    the ratio of their geometric means; its standard error sigma × sqrt(1/n_before +
    1/n_after), the after side's variance ``BUSY_NOISE_FACTOR``² times larger when those runs
    were made on a busy machine. An inconclusive verdict counts the further runs of the
    *after* side that would decide."""
    if not before_ms or not after_ms:
        raise ValueError("judge_change needs at least one run on each side")
    delta = math.log(log_mean_ms(after_ms) / log_mean_ms(before_ms))
    after_var = noise.sigma**2 * (BUSY_NOISE_FACTOR**2 if after_busy else 1.0)
    n_a, n_b = len(before_ms), len(after_ms)

    def se_with(more: int) -> tuple[float, float]:
        se = math.sqrt(noise.sigma**2 / n_a + after_var / (n_b + more))
        return se, noise.df + more

    se, df = se_with(0)
    return judge(delta, se, df, margin, one_sided=one_sided, se_with_more=se_with)
