"""The values a run was given beside its configuration, and which of them tell its runs apart.

A configuration (:mod:`.configuration`) is the code, the DataLoader's settings and the versions;
the **values** a run was given are not part of it: the plain values its cell read from the
notebook (the environment's ``cell_values``: ``HIDDEN = 1024`` in a settings cell) and a
script's arguments, each by its name (``script_args``: ``--model``, ``argument 1``; a run
stored before those were recorded has one hash for all of them, ``script_args_sha``, named
:data:`ARGUMENTS` here). A value that differs in every run (a timestamp, a run id, an output
directory per run) would make each run a configuration of its own, with no noise and no
baseline of its own.

So a value tells runs apart only once it **repeats**: a name counts when two or more of the
runs hold the same value of it (:func:`repeating_names`). ``HIDDEN`` 256, 256, 1024 counts
(the runs at 256 are one kind, the run at 1024 another); a timestamp never does. Within a
configuration, runs whose counted values agree are one **variant**: the baseline prefers the
runs of the judged run's variant, and the noise is each variant's scatter around its own mean
(a changed value shifts the mean, as a changed DataLoader does, and is not noise). A run that
did not record a name (stored before values were recorded) agrees with any value of it; a
script's run that recorded its arguments by name and did not give one (a flag) is told apart
by the names it gave (:data:`ARGUMENT_NAMES`). An argument or a string that differs in every
run is an identifier, and what changed names it apart from the changes (:func:`unsettled_names`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The name a script's arguments go by among a run's values where only their one hash was
#: recorded (``script_args_sha``).
ARGUMENTS = "(arguments)"
#: ...and, where each was recorded by name, the names given (a flag given or not: a run
#: without ``--fp16`` did not leave it unrecorded, it did not give it).
ARGUMENT_NAMES = "(argument names)"
#: A script's argument or a string value (stored as a hash) that differs in every one of at
#: least this many runs that recorded it is an identifier — a run id, an output directory per
#: run, a timestamp — and what changed names it apart from the changes (:func:`unsettled_names`).
#: Two runs cannot tell: two values of a setting differ too. A number is shown as written
#: (``HIDDEN 512 → 1024``) and stays a change whatever it does.
UNSETTLED_MIN_RUNS = 3

#: A run's values: name -> the value as written (a hash for a string or the arguments).
Values = Mapping[str, str]
#: The values of the names that tell runs apart, sorted (:func:`variant`).
Variant = tuple[tuple[str, str], ...]


def values_of(environment: Mapping[str, Any]) -> dict[str, str]:
    """The values a run was given, from its environment: the notebook values its cell read
    (``cell_values``) and, for a script, each of its arguments (``script_args``) and their
    one hash (as :data:`ARGUMENTS`: all that runs stored before arguments were recorded by
    name have, so that they are told apart from the later runs as among themselves)."""
    found: dict[str, str] = {}
    cell = environment.get("cell_values")
    if isinstance(cell, Mapping):
        found.update({str(name): str(value) for name, value in cell.items()})
    arguments = environment.get("script_args")
    if isinstance(arguments, Mapping):
        found.update({str(name): str(value) for name, value in arguments.items()})
        found[ARGUMENT_NAMES] = " ".join(sorted(str(name) for name in arguments))
    if isinstance(environment.get("script_args_sha"), str):  # what runs stored before share
        found[ARGUMENTS] = environment["script_args_sha"]
    return found


def is_argument(name: str) -> bool:
    """``name`` is a script's argument (``--model``, ``argument 1``, :data:`ARGUMENTS`,
    :data:`ARGUMENT_NAMES`), not a notebook value (a Python name)."""
    return name in (ARGUMENTS, ARGUMENT_NAMES) or name.startswith(("-", "argument "))


def repeating_names(runs: Iterable[Values]) -> set[str]:
    """The names some value of which two or more of ``runs`` hold."""
    seen: set[tuple[str, str]] = set()
    repeated: set[str] = set()
    for values in runs:
        for item in values.items():
            if item in seen:
                repeated.add(item[0])
            seen.add(item)
    return repeated


def unsettled_names(runs: Iterable[Values], min_runs: int = UNSETTLED_MIN_RUNS) -> set[str]:
    """The arguments and string values that ``min_runs`` or more of ``runs`` recorded and no
    two of them hold alike: identifiers (:data:`UNSETTLED_MIN_RUNS`)."""
    held: dict[str, list[str]] = {}
    for values in runs:
        for name, value in values.items():
            held.setdefault(name, []).append(value)
    return {
        name
        for name, values in held.items()
        if len(values) >= min_runs
        and len(set(values)) == len(values)
        and (is_argument(name) or all(v.startswith("str:") for v in values))
    }


def other_values(a: Values, b: Values, ignore: Iterable[str] = ()) -> list[str]:
    """The names that ``a`` and ``b`` both recorded and hold other values of, sorted, or an
    argument one of them gave and the other did not (both recorded by name); ``ignore``
    (identifiers, :func:`unsettled_names`) left out."""
    by_name = ARGUMENT_NAMES in a and ARGUMENT_NAMES in b
    skip = {ARGUMENT_NAMES, *ignore}
    return [
        n
        for n in sorted((set(a) | set(b)) - skip)
        if (a[n] != b[n] if n in a and n in b else by_name and is_argument(n))
    ]


def ranks_own(ranks: Sequence[Values]) -> set[str]:
    """The names whose values differ between the ranks of one job (``ranks``: each rank's
    values): the rank's own (a ``--local-rank=N`` a launcher passes each process), not the
    job's."""
    names = {n for values in ranks for n in values}
    return {n for n in names if len({values.get(n) for values in ranks}) > 1}


def agree(a: Values, b: Values, names: Iterable[str]) -> bool:
    """``a`` and ``b`` hold the same value of every one of ``names`` that both recorded."""
    return all(a[n] == b[n] for n in names if n in a and n in b)


def differing_names(runs: Sequence[Values], names: Iterable[str]) -> tuple[str, ...]:
    """Of ``names``, those that ``runs`` recorded more than one value of, sorted: where runs
    were told apart, by what. An argument a run recorded by name did not give (a flag) counts
    as a value of its own, and where the names given told runs apart (:data:`ARGUMENT_NAMES`),
    the arguments given in some of them only are among ``names``."""

    def held(values: Values, name: str) -> str | None:
        return values.get(name) if name in values or not is_argument(name) else None

    names = set(names)
    if ARGUMENT_NAMES in names:
        given: list[set[str]] = [set(v) for v in runs if ARGUMENT_NAMES in v]
        some, every = set[str]().union(*given), given[0].intersection(*given[1:])
        names |= {n for n in some - every if is_argument(n)}
    differing = []
    for name in names:
        recorded = [v for v in runs if name in v or (ARGUMENT_NAMES in v and is_argument(name))]
        if len({held(v, name) for v in recorded}) > 1:
            differing.append(name)
    return tuple(sorted(differing))


def told_apart(
    mine: Values, given: Sequence[Values]
) -> tuple[list[int], bool | None, tuple[str, ...]]:
    """Which of the runs given ``given`` (oldest first) to judge a run given ``mine`` against:
    where values tell them apart (:func:`repeating_names`, the judged run among them), the
    indices of those given ``mine`` (True), else, for values not run before, of those given the
    latest run's (False), and the names that told them apart (:func:`differing_names`); all of
    them (None) where values tell nothing apart."""
    names = repeating_names([*given, mine])
    same = [i for i, values in enumerate(given) if agree(values, mine, names)]
    if len(same) == len(given):
        return same, None, ()
    split_by = differing_names([*given, mine], names)
    if same:
        return same, True, split_by
    return [i for i, values in enumerate(given) if agree(values, given[-1], names)], False, split_by


def variant(values: Values, names: Iterable[str]) -> Variant:
    """The values of ``names`` a run recorded, sorted: equal variants are one kind of run
    (a run that recorded none of them is a kind of its own)."""
    return tuple(sorted((n, values[n]) for n in names if n in values))
