"""Which earlier runs a run is judged against, and the run-to-run noise it is judged with.

A run's **baseline** (:func:`choose_baseline`) is, in order:

* the runs pinned for its name (``%traceml baseline NAME set``), as they are;
* else the last ``BASELINE_RUNS`` earlier runs of its own configuration (:mod:`~traceml_nb.
  analysis.configuration`): same name, hardware class, code, DataLoader settings and versions
  (runs stored before a cell's notebook code was recorded count where the rest is the same);
* else, for a run whose configuration is new, the last runs of the configuration before it
  (that of the latest earlier run of the name), and the comparison says what changed.

Only completed runs with steady steps count, on the run's hardware class; a run that ran on a
quiet machine is judged against quiet runs where there are any (busy runs do not make later
baselines); of a configuration's runs, those of the level of step time a new run is judged
against (:mod:`~traceml_nb.analysis.levels`: a shift no setting shows is not mixed into the runs
before it until it has held). Runs come from the store when the run's name is stable
(:func:`stable_name`) and the store can be read, else from this session's history.

The **noise** (:func:`noise_for`) pools the compared configurations' own quiet runs, each level
of each around its own mean, and, as a prior, what the other configurations of the machine class
have shown (:func:`machine_points`; :func:`traceml_nb.analysis.noise.estimate_noise`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..analysis.formatting import fmt_run_span, plural
from ..analysis.levels import baseline_level, by_level, run_levels
from ..analysis.noise import Noise, RunPoint, estimate_noise, is_busy
from ..analysis.thresholds import BASELINE_RUNS, LEVEL_RUNS
from ..analysis.variants import (
    Values,
    Variant,
    repeating_names,
    told_apart,
    unsettled_names,
    values_of,
    variant,
)
from .environment import hardware_class
from .history import History, RunEntry, run_configuration, stable_name

if TYPE_CHECKING:
    from ..analysis.configuration import Configuration
    from .store import Store

#: The kinds of baseline (:attr:`Baseline.kind`).
PINNED, SAME, EARLIER = "pinned", "same configuration", "earlier configuration"
#: How the runs of a configuration were chosen by their values (:attr:`Baseline.values`).
SAME_VALUES, OTHER_VALUES = "same values", "other values"


@dataclass
class Baseline:
    """The runs a run is judged against (oldest first), ``kind`` (:data:`PINNED`,
    :data:`SAME` or :data:`EARLIER`) and ``note``: '' or why it is what it is (a store that
    could not be read). ``values``: where the configuration's runs were given values that tell
    them apart (:mod:`~traceml_nb.analysis.variants`), :data:`SAME_VALUES` (the runs given the
    judged run's) or :data:`OTHER_VALUES` (none was: the runs of the latest earlier run's), of
    ``split_by`` (the names that told them apart); else ''."""

    runs: list[RunEntry]
    kind: str = SAME
    note: str = ""
    values: str = ""
    split_by: tuple[str, ...] = ()


def _quiet_first(runs: list[RunEntry], entry: RunEntry, k: int, by_levels: bool = True) -> Baseline:
    """The last ``k`` of ``runs``: only quiet ones where there are any, unless ``entry`` itself
    ran on a busy machine; of those (with ``by_levels``: runs of one hardware class), the runs of
    the level a new run is judged against (:func:`~traceml_nb.analysis.levels.baseline_level`:
    a slowdown no setting shows is not mixed into the runs before it), the later runs left out
    named in the note."""
    if not is_busy(entry.load):
        quiet = [r for r in runs if not is_busy(r.load)]
        if quiet:
            runs = quiet
    medians = [r.summary.step_ms_median for r in runs]
    if not by_levels or not runs or not all(m is not None and m > 0 for m in medians):
        return Baseline(runs[-k:])
    levels = run_levels([float(m or 0.0) for m in medians], _step_ms(entry))
    chosen = baseline_level(levels)
    last = max(i for i, level in enumerate(levels) if level == chosen)
    later = runs[last + 1 :]
    note = ""
    if later:
        labels = [("@", r.stored_id) if r.origin == "store" else ("#", r.id) for r in later]
        note = (
            f"the later {plural(len(later), 'run')} of this configuration ({fmt_run_span(labels)}) "
            "moved away from the baseline's step time with nothing in the configuration to "
            f"show why; {LEVEL_RUNS} runs at one step time make them the baseline"
        )
    chosen_runs = [r for r, level in zip(runs, levels, strict=True) if level == chosen]
    return Baseline(chosen_runs[-k:], note=note)


def _step_ms(entry: RunEntry) -> float:
    return float(entry.summary.step_ms_median or 0.0)


def _same_key(
    entry: RunEntry, any_hardware: bool, config: Configuration | None = None
) -> str | list[tuple[str, str]]:
    """What two runs of one configuration share: the key, or with ``any_hardware`` (the
    hardware class crossed on request) every part but the hardware (of ``config``, default
    the entry's)."""
    config = config or entry.configuration
    if not any_hardware:
        return config.key
    return sorted((k, repr(v)) for k, v in config.parts.items() if k != "hardware")


def _key_before_definitions(
    entry: RunEntry, any_hardware: bool
) -> str | list[tuple[str, str]] | None:
    """What ``entry``'s configuration was before a cell's notebook code was recorded
    (``cell_definitions``, a part of the code since): the same cell source, settings and
    versions, without it; None where the entry recorded none. Runs stored before, of that key,
    are its configuration's as far as was recorded (what changed says the rest was not)."""
    if not entry.environment.get("cell_definitions"):
        return None
    environment = {k: v for k, v in entry.environment.items() if k != "cell_definitions"}
    config = run_configuration(entry.name, entry.named, entry.source, entry.loaders, environment)
    return _same_key(entry, any_hardware, config)


def _records_definitions(run: RunEntry) -> bool:
    return isinstance(run.environment.get("cell_definitions"), dict)


def _split(
    entry: RunEntry, earlier: list[RunEntry], any_hardware: bool = False, k: int = BASELINE_RUNS
) -> Baseline:
    """Baseline from ``earlier`` runs (oldest first, already of the right name and class): the
    last ``k`` of a configuration."""
    key = _same_key(entry, any_hardware)
    unrecorded = _key_before_definitions(entry, any_hardware)
    keyed = [(r, _same_key(r, any_hardware)) for r in earlier]
    same = [
        r
        for r, their in keyed
        if their == key or (their == unrecorded and not _records_definitions(r))
    ]
    if same:
        runs, values, names = _by_values(entry, same)
        chosen = _quiet_first(runs, entry, k, by_levels=not any_hardware)
        return replace(chosen, kind=SAME, values=values, split_by=names)
    if not earlier:
        return Baseline([], SAME)
    before = keyed[-1][1]
    runs, values, names = _by_values(entry, [r for r, their in keyed if their == before])
    chosen = _quiet_first(runs, entry, k, by_levels=not any_hardware)
    return replace(chosen, kind=EARLIER, values=values, split_by=names)


def _by_values(
    entry: RunEntry, runs: list[RunEntry]
) -> tuple[list[RunEntry], str, tuple[str, ...]]:
    """Of ``runs`` (one configuration: ``entry``'s, or the one before it), those given
    ``entry``'s values where values tell the runs apart, else those given the latest run's;
    with which (:attr:`Baseline.values`) and the names that told them apart."""
    chosen, same, split_by = told_apart(
        values_of(entry.environment), [values_of(r.environment) for r in runs]
    )
    return [runs[i] for i in chosen], VALUES_WORDS[same], split_by


#: :attr:`Baseline.values` of :func:`~traceml_nb.analysis.variants.told_apart`'s outcome.
VALUES_WORDS = {None: "", True: SAME_VALUES, False: OTHER_VALUES}


#: How many of a name's latest runs are read from the store to choose a baseline among.
STORE_LOOKBACK = 200


def choose_baseline(
    entry: RunEntry,
    history: History | None,
    store: Store | None,
    *,
    any_hardware: bool = False,
    before: int | None = None,
    k: int = BASELINE_RUNS,
) -> Baseline:
    """The baseline of ``entry`` (module docstring). ``store``: a
    :class:`~.store.Store` or None; ``before``: only stored runs older than this store id
    (the gate's candidate); ``k``: runs of a configuration it takes at most. A rank of a
    ``torchrun`` job is compared with the same rank of earlier jobs of its world size, a run
    alone with runs alone."""
    from .store import StoreError

    hardware = None if any_hardware else hardware_class(entry.environment)
    note = ""
    if store is not None and stable_name(entry) and store.exists():
        rank_of = None
        if entry.job_id is not None and entry.rank is not None and entry.world_size:
            rank_of = (entry.rank, entry.world_size, entry.job_id)
        try:
            pinned = store.pins(entry.name)
            runs = store.baseline(
                entry.name,
                hardware=hardware,
                before=before,
                k=STORE_LOOKBACK,
                alone=rank_of is None,
                rank_of=rank_of,
            )
            if entry.stored_id is not None:
                runs = [r for r in runs if r.stored_id != entry.stored_id]
            if pinned:
                return Baseline(runs, PINNED)
            return _split(entry, runs, any_hardware, k)
        except StoreError as exc:
            note = f"baseline from this session only: {exc}"
    earlier = [
        e
        for e in (history.same_cell(entry) if history is not None else [])
        if e.status == "completed"
        and len(e.step_ms) >= 2
        and (hardware is None or hardware_class(e.environment) == hardware)
    ]
    found = _split(entry, earlier, any_hardware, k)
    found.note = "; ".join(n for n in (note, found.note) if n)
    return found


def machine_points(
    entry: RunEntry,
    history: History | None,
    store: Store | None,
    *,
    before: int | None = None,
    also: Sequence[RunEntry] = (),
    made_before: bool = False,
) -> list[RunPoint]:
    """Every run of ``entry``'s hardware class the noise model may learn from: the store's
    (all names; older than store id ``before`` when given), this session's that are not
    stored and the runs ``also`` (the gate's candidates, stored after ``before``), ``entry``
    itself left out, and so are the ranks of ``torchrun`` jobs (a job's ranks differ by their
    roles, not by noise: a job's noise is that of its slowest ranks). ``made_before``: only
    the runs made before ``entry`` (``%traceml compare`` of two earlier runs reads the noise
    their report read, not one later runs widened). A store that cannot be read adds
    nothing."""
    from .store import StoreError

    if made_before and before is None and entry.stored_id is not None:
        before = entry.stored_id
    hardware = hardware_class(entry.environment)
    points: list[tuple[RunPoint, Values | None]] = []
    # ``entry`` read back from the store is also this session's run of that id: left out too
    stored: set[int] = {entry.stored_id} if entry.stored_id is not None else set()
    if store is not None and store.exists():
        try:
            given = store.values_given(entry.name)
            for row in store.class_rows(hardware, before=before):
                if row.id == entry.stored_id or row.step_ms_median is None or row.job_id:
                    continue
                stored.add(row.id)
                point = RunPoint(row.config, float(row.step_ms_median), is_busy(row.load))
                points.append((point, given.get(row.id) if row.name == entry.name else None))
        except StoreError:
            pass
    entries = list(history.entries) if history is not None else []
    if made_before:  # (the history's runs before it; one read back from the store: by time)
        at = next((i for i, e in enumerate(entries) if e is entry), None)
        entries = (
            entries[:at]
            if at is not None
            else [e for e in entries if e.started_at < entry.started_at]
        )
    for e in entries:
        median = e.summary.step_ms_median
        if (
            e is entry
            or e.status != "completed"
            or median is None
            or (e.stored_id is not None and e.stored_id in stored)
            or e.job_id is not None
            or hardware_class(e.environment) != hardware
        ):
            continue
        point = RunPoint(e.configuration.key, float(median), is_busy(e.load))
        points.append((point, values_of(e.environment) if e.name == entry.name else None))
    for e in also:
        point = RunPoint(
            e.configuration.key, float(e.summary.step_ms_median or 0.0), is_busy(e.load)
        )
        points.append((point, values_of(e.environment) if e.name == entry.name else None))
    return _with_variants(points, entry)


def identifiers(name: str, history: History | None, store: Store | None) -> set[str]:
    """The identifiers among the values the runs of ``name`` were given, ``history``'s and
    ``store``'s (:func:`~traceml_nb.analysis.variants.unsettled_names`: a run id), each run
    once. :class:`~.store.StoreError` when the store cannot be read."""
    given: dict[int, Values] = {}
    if store is not None and store.exists():
        given.update(store.values_given(name))
    for i, e in enumerate(history.entries if history is not None else []):
        if e.name == name and e.environment:
            given[e.stored_id if e.stored_id is not None else -1 - i] = values_of(e.environment)
    return unsettled_names(given.values())


def _with_variants(points: list[tuple[RunPoint, Values | None]], entry: RunEntry) -> list[RunPoint]:
    """The points, those given with values (the judged run's name's) with their variant: the
    values that repeat among their configuration's runs, ``entry`` among its own
    (:mod:`~traceml_nb.analysis.variants`; as its baseline is chosen)."""
    given: dict[str | None, list[Values]] = {
        entry.configuration.key: [values_of(entry.environment)]
    }
    for point, values in points:
        if values is not None:
            given.setdefault(point.config, []).append(values)
    names = {config: repeating_names(runs) for config, runs in given.items()}
    return [
        point if values is None else replace(point, variant=variant(values, names[point.config]))
        for point, values in points
    ]


def judging(
    entry: RunEntry, before: Sequence[RunEntry], points: Sequence[RunPoint]
) -> dict[str, Any]:
    """The keyword arguments that judge ``entry`` against the runs ``before`` (for
    :func:`~traceml_nb.analysis.compare` and :func:`~traceml_nb.analysis.baseline.
    compare_with_baseline`): the noise of the configurations they compare (:func:`noise_for`
    over ``points``, :func:`machine_points`) and whether ``entry`` alone ran on a busy
    machine."""
    keys = {entry.configuration.key, *(r.configuration.key for r in before)}
    step_ms = entry.summary.step_ms_median or 0.0
    across = across_sessions(entry, before)
    return {
        "noise": noise_for(entry, keys, points, step_ms, across=across),
        "after_busy": is_busy(entry.load) and not all(is_busy(r.load) for r in before),
    }


def across_sessions(entry: RunEntry, runs: Iterable[RunEntry]) -> bool:
    """Some of ``runs`` were made in another session than ``entry`` (so in another process)."""
    return any(r.session_id is not None and r.session_id != entry.session_id for r in runs)


def noise_for(
    entry: RunEntry,
    configs: Iterable[str],
    points: Sequence[RunPoint],
    step_ms: float,
    *,
    across: bool = False,
) -> Noise:
    """The noise for comparing ``entry`` with runs of ``configs`` (configuration keys; its own
    among them): those configurations' quiet runs in ``points`` estimate it, the others of the
    machine class are the prior. For a run made on a busy machine the busy runs count too:
    judged among its own kind, not against a noise no busy run could show. ``across``: the
    runs compared come from other sessions (:func:`across_sessions`)."""
    wanted = set(configs)
    if is_busy(entry.load):  # a run on a busy machine: the busy runs are its own kind
        points = [replace(p, busy=False) for p in points]
    groups: dict[tuple[str, Variant], list[float]] = {}
    for p in points:  # a configuration's runs given other values scatter around their own mean
        if p.config in wanted and p.config is not None and not p.busy:
            groups.setdefault((p.config, p.variant), []).append(p.median_ms)
    # ...and so do its runs at each level of its step time (:mod:`~traceml_nb.analysis.levels`)
    own = [
        level
        for runs in groups.values()
        for level in by_level(runs, run_levels(runs, step_ms) if step_ms > 0 else [0] * len(runs))
    ]
    noise = estimate_noise(own, step_ms, points, own_configs=sorted(wanted), across_sessions=across)
    counted = {config for (config, _), runs in groups.items() if len(runs) >= 2}
    return replace(noise, own_configs=len(counted))  # configurations, not their variants
