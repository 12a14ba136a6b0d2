"""What changed between a run and its baseline: the code, the settings, the environment, the
machine's load. Pure functions of what the runs stored.

The machine's load has two parts, each a share 0..1 of the machine's CPU time, mean over the
run: ``other_cpu_share``, what *other processes* of this machine used, and ``steal_share``,
what the *hypervisor* took for other guests (steal time, where the kernel reports it). A
slowdown with the same code, settings and machine, while other processes kept the CPUs busy or
the hypervisor took them, is the machine's: :func:`what_changed` says so in its summary
sentence.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from .findings import Changes
from .formatting import fmt_share
from .thresholds import (
    BUSY_MACHINE_SHARE,
    LOAD_CHANGE_SHARE,
    MATERIAL_STEAL_SHARE,
    SOURCE_DIFF_LINES,
    STEAL_CHANGE_SHARE,
)
from .variants import ARGUMENT_NAMES, ARGUMENTS, unsettled_names, values_of

#: The environment fields compared (see ``traceml_nb.session.environment``).
ENVIRONMENT_FIELDS = (
    "device_kind",
    "gpu_name",
    "gpu_memory_mb",
    "gpu_driver",
    "cuda_version",
    "gpu_compute_capability",
    "gpu_count",
    "torch_version",
    "python_version",
    "traceml_nb_version",
    "cpu_model",
    "cpus_available",
    "cpu_count",
    "host_hash",
    "git_commit",
    "git_dirty",
)
#: The training DataLoader's settings compared, and its dataset.
LOADER_FIELDS = (
    "num_workers",
    "pin_memory",
    "prefetch_factor",
    "persistent_workers",
    "batch_size",
    "dataset_type",
    "dataset_len",
)


def source_diff(before: str | None, after: str | None, limit: int = SOURCE_DIFF_LINES) -> list[str]:
    """The lines of the cell source that changed, ``- old`` and ``+ new`` (blank lines and
    trailing spaces ignored), at most ``limit`` and then ``… and N more``; [] when the same or
    when either source is unknown."""
    if before is None or after is None:
        return []
    a = [line.rstrip() for line in before.splitlines() if line.strip()]
    b = [line.rstrip() for line in after.splitlines() if line.strip()]
    if a == b:
        return []
    out = []
    for line in difflib.unified_diff(a, b, lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        out.append(f"{line[0]} {line[1:].strip()}")
    if len(out) > limit:
        out = [*out[:limit], f"\u2026 and {len(out) - limit} more changed lines"]
    return out


def definitions_unrecorded(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Only the later run recorded the notebook code its cell uses (``cell_definitions``): the
    earlier one was stored before it was recorded, so the two cannot be shown to run the same
    code beyond the cell's own."""
    b = after.get("cell_definitions")
    return isinstance(b, dict) and bool(b) and not isinstance(before.get("cell_definitions"), dict)


def definition_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The notebook's functions and classes a cell uses (``cell_definitions``: name -> a hash
    of the source) that changed, are new or are no longer used, one line each; [] where either
    run did not record them."""
    a, b = before.get("cell_definitions"), after.get("cell_definitions")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in a:
            out.append(f"{name} is used now (defined outside the cell)")
        elif name not in b:
            out.append(f"{name} is no longer used")
        elif a[name] != b[name]:
            out.append(f"{name} changed (defined outside the cell)")
    return out


def value_changes(
    before: Mapping[str, Any], after: Mapping[str, Any], skip: Collection[str] = ()
) -> list[str]:
    """The plain values a cell reads from the notebook (``cell_values``: name -> as written,
    a string as a hash) that differ, one line each: ``HIDDEN 512 → 1024``, ``MODEL changed
    (a string, stored as a hash)``; [] where either run did not record them. ``skip``: names
    left out (identifiers, :func:`~.variants.unsettled_names`; a job's ranks' own)."""
    a, b = before.get("cell_values"), after.get("cell_values")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    out = []
    for name in sorted(set(a) & set(b)):
        old, new = a[name], b[name]
        if old == new or name in skip:
            continue
        if str(old).startswith("str:") or str(new).startswith("str:"):
            out.append(f"{name} changed (a string, stored as a hash)")
        else:
            out.append(f"{name} {old} \u2192 {new}")
    return out


def training_loader(loaders: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The run's training loader (optimizer steps followed its batches), else its first."""
    for info in loaders:
        if info.get("optimizer_steps", 0):
            return info
    return loaders[0] if loaders else None


def _show(value: Any) -> str:
    if isinstance(value, str) and len(value) == 40 and all(c in "0123456789abcdef" for c in value):
        return value[:10]  # a git commit
    return "\u2014" if value is None else str(value)


def _field_changes(
    before: Mapping[str, Any], after: Mapping[str, Any], names: Iterable[str]
) -> list[str]:
    return [
        f"{name} {_show(before.get(name))} \u2192 {_show(after.get(name))}"
        for name in names
        if before.get(name) != after.get(name)
    ]


def _hash_change(
    before: Mapping[str, Any], after: Mapping[str, Any], field: str, what: str, unseen: str
) -> str | None:
    """``its {what} changed (stored as a hash, aaaa1111 → cccc3333: not {unseen})`` when both
    runs stored the hash ``field`` and it differs, else None."""
    a, b = before.get(field), after.get(field)
    if not a or not b or a == b:
        return None
    return f"its {what} changed (stored as a hash, {a[:8]} \u2192 {b[:8]}: not {unseen})"


def script_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    """A sentence when both runs were of a main script (``script_sha``, where no cell source
    was stored) and its source differs, else None."""
    return _hash_change(before, after, "script_sha", "source", "its lines")


def changed_arguments(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str] | None:
    """The names of the main script's arguments (``script_args``) whose values differ, or
    that one run gave and the other did not, in ``after``'s order; None where either run did
    not record its arguments by name."""
    a, b = before.get("script_args"), after.get("script_args")
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None
    return [n for n in (*b, *(n for n in a if n not in b)) if a.get(n) != b.get(n)]


def arguments_change(
    before: Mapping[str, Any], after: Mapping[str, Any], skip: Collection[str] = ()
) -> str | None:
    """A sentence when both runs were of a main script that recorded its arguments and they
    differ, else None: ``its arguments changed: --model, --fp16 (given now) (each stored as
    a hash: not its value)``, or, where either run recorded only their one hash
    (``script_args_sha``), ``its arguments changed (stored as a hash, …)``. ``python
    train.py --model big`` after ``--model small`` is one configuration (a timestamped
    ``--output-dir`` must not split every run into its own), but not the same work.
    ``skip``: arguments left out (identifiers, a job's ranks' own; :data:`~.variants.
    ARGUMENTS` for the one hash of them all)."""
    names = changed_arguments(before, after)
    if names is None:
        if ARGUMENTS in skip:
            return None
        return _hash_change(before, after, "script_args_sha", "arguments", "the arguments")
    names = [n for n in names if n not in skip]
    if not names:
        return None
    a, b = before["script_args"], after["script_args"]
    listed = ", ".join(
        f"{n} (given now)" if n not in a else f"{n} (no longer given)" if n not in b else n
        for n in names
    )
    return f"its arguments changed: {listed} (each stored as a hash: not its value)"


def loader_changes(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[str]:
    """How the training DataLoader's settings and dataset differ (``num_workers 0 → 4``)."""
    a, b = training_loader(before), training_loader(after)
    if a is None or b is None:
        return [] if a is b else ["a DataLoader " + ("appeared" if a is None else "is gone")]
    return _field_changes(a, b, LOADER_FIELDS)


def environment_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """How the environments differ; fields one run did not record (empty dict) are skipped."""
    if not before or not after:
        return []
    names = [n for n in ENVIRONMENT_FIELDS if n in before and n in after]
    out = _field_changes(before, after, [n for n in names if n != "host_hash"])
    if before.get("host_hash") != after.get("host_hash"):
        out.append("another host")
    return out


def _finite(column: Sequence[float | None], i: int) -> float | None:
    value = column[i] if i < len(column) else None
    return None if value is None or math.isnan(value) else float(value)


def other_cpu_share(
    host: Mapping[str, Sequence[float]] | None, cpu_count: int | None
) -> float | None:
    """The mean share (0..1) of the machine's ``cpu_count`` CPUs that *other* processes used
    during a run, from its host samples: the whole machine's busy share (``sys_cpu_pct``)
    less this process and its DataLoader workers (``proc_cpu_pct``, ``workers_cpu_pct``, 100 =
    one core) and less the steal time (``steal_pct``, where measured: the kernel counts it
    busy, but it is the hypervisor's, see :func:`steal_share`). None without host samples."""
    if not host or not cpu_count:
        return None
    system = host.get("sys_cpu_pct") or ()
    own = host.get("proc_cpu_pct") or ()
    workers = host.get("workers_cpu_pct") or ()
    steal = host.get("steal_pct") or ()
    shares = []
    for i in range(len(system)):
        sys_pct = _finite(system, i)
        if sys_pct is None:
            continue
        mine = sum(v for v in (_finite(own, i), _finite(workers, i)) if v is not None)
        stolen = _finite(steal, i) or 0.0
        shares.append(max(0.0, sys_pct / 100 - mine / 100 / cpu_count - stolen / 100))
    return sum(shares) / len(shares) if shares else None


def steal_share(host: Mapping[str, Sequence[float]] | None) -> float | None:
    """The mean share (0..1) of the machine's CPU time the hypervisor took during a run (steal
    time: it ran other guests while this virtual machine wanted to run), from the host
    samples' ``steal_pct``. None where no sample measured it (a kernel without steal time)."""
    column = (host or {}).get("steal_pct") or ()
    known = [v for v in (_finite(column, i) for i in range(len(column))) if v is not None]
    return sum(known) / len(known) / 100 if known else None


def load_sentence(share: float | None, baseline: float | None) -> str | None:
    """The machine's load in words when it differs from the baseline's (``None`` otherwise):
    the share moved by ``LOAD_CHANGE_SHARE`` or more and one of them is ``BUSY_MACHINE_SHARE``
    or more."""
    if share is None or baseline is None:
        return None
    if abs(share - baseline) < LOAD_CHANGE_SHARE or max(share, baseline) < BUSY_MACHINE_SHARE:
        return None
    return (
        f"other processes used {fmt_share(share)} of the CPUs during this run "
        f"({fmt_share(baseline)} during the baseline)"
    )


def _steal_phrase(share: float) -> str:
    return f"the hypervisor took {fmt_share(share)} of the CPUs (steal time) during this run"


def steal_sentence(share: float | None, baseline: float | None) -> str | None:
    """The steal time in words when it was material and differs from the baseline's (``None``
    otherwise): one of the two is ``MATERIAL_STEAL_SHARE`` or more and it moved by
    ``STEAL_CHANGE_SHARE`` or more, or this run's is material and the baseline did not
    measure it."""
    if share is None:
        return None
    if baseline is None:
        if share < MATERIAL_STEAL_SHARE:
            return None
        return f"{_steal_phrase(share)} (not measured during the baseline)"
    if abs(share - baseline) < STEAL_CHANGE_SHARE or max(share, baseline) < MATERIAL_STEAL_SHARE:
        return None
    return f"{_steal_phrase(share)} ({fmt_share(baseline)} during the baseline)"


class RunSetup(Protocol):
    """What :func:`what_changed` reads of a run (a history entry,
    :class:`~traceml_nb.session.history.RunEntry`)."""

    @property
    def source(self) -> str | None: ...  # the cell's text

    @property
    def loaders(self) -> list[dict[str, Any]]: ...  # LoaderInfo.to_dict() each

    @property
    def environment(self) -> dict[str, Any]: ...  # capture_environment(), {} when not captured

    @property
    def load(self) -> dict[str, Any]: ...  # ``other_cpu_share``, ``steal_share``


def unsettled_of(runs: Iterable[RunSetup]) -> set[str]:
    """The identifiers among the values ``runs`` were given (:func:`~.variants.
    unsettled_names`), to leave out of what changed between two of them."""
    return unsettled_names(values_of(r.environment) for r in runs)


def unsettled_changes(
    before: Mapping[str, Any], after: Mapping[str, Any], unsettled: Collection[str]
) -> list[str]:
    """Of ``unsettled`` (identifiers), those whose value differs between the two runs, as the
    words name them (``--run-name``, ``RUN_ID``, ``the arguments`` for their one hash)."""
    a, b = values_of(before), values_of(after)
    by_name = ARGUMENT_NAMES in a and ARGUMENT_NAMES in b  # their names say which differ
    return [
        "the arguments" if n == ARGUMENTS else n
        for n in sorted(unsettled)
        if n in a and n in b and a[n] != b[n] and not (n == ARGUMENTS and by_name)
    ]


def what_changed(
    before: RunSetup | None,
    after: RunSetup | None,
    *,
    verdict: str | None = None,
    baseline_load_share: float | None = None,
    baseline_steal_share: float | None = None,
    unsettled: Collection[str] = (),
    ranks_own: Collection[str] = (),
) -> Changes:
    """What differs from run ``before`` (the latest baseline run) to run ``after``: both have
    ``source``, ``loaders`` (dicts), ``environment`` and ``load`` (``other_cpu_share``,
    ``steal_share``; None: a run not known, nothing said of it). ``baseline_load_share`` and
    ``baseline_steal_share`` (default: ``before``'s) are the baseline's load; ``verdict`` the
    comparison's ("slower" lets the summary say whose slowdown it is). ``unsettled``: the
    identifiers among the runs' values (:func:`~.variants.unsettled_names` of the runs around:
    a run id differs in every run), named apart from the changes; ``ranks_own``: the values
    that differ between the ranks of a job (a ``--local-rank``), left out where ``before``
    and ``after`` are two jobs' ranks."""
    before_load = before.load if before is not None else {}
    after_load = after.load if after is not None else {}
    base_load = (
        baseline_load_share
        if baseline_load_share is not None
        else before_load.get("other_cpu_share")
    )
    base_steal = (
        baseline_steal_share if baseline_steal_share is not None else before_load.get("steal_share")
    )
    share = after_load.get("other_cpu_share")
    steal = after_load.get("steal_share")
    before_env = before.environment if before is not None else {}
    after_env = after.environment if after is not None else {}
    skip = {*unsettled, *ranks_own}
    changes = Changes(
        code=source_diff(before.source if before else None, after.source if after else None),
        definitions=definition_changes(before_env, after_env),
        definitions_unrecorded=definitions_unrecorded(before_env, after_env),
        values=value_changes(before_env, after_env, skip),
        script=script_change(before_env, after_env),
        arguments=arguments_change(before_env, after_env, skip),
        argument_names=[n for n in changed_arguments(before_env, after_env) or [] if n not in skip],
        unsettled=unsettled_changes(before_env, after_env, unsettled),
        settings=loader_changes(before.loaders if before else [], after.loaders if after else []),
        environment=environment_changes(before_env, after_env),
        load=load_sentence(share, base_load),
        load_share=share,
        baseline_load_share=base_load,
        steal=steal_sentence(steal, base_steal),
        steal_share=steal,
        baseline_steal_share=base_steal,
    )
    changes.summary = _summary(changes, verdict)
    return changes


def _code_words(changes: Changes) -> str:
    """``same code``, ``the code changed``, ``same code, other arguments`` (a script's) or
    ``… other values`` (a cell's notebook values), ``the code and its arguments changed``, or
    the same cell where the code of other cells it uses was not recorded before."""
    other = [
        what
        for what, changed in (("arguments", changes.arguments), ("values", changes.values))
        if changed
    ]
    every = ""
    if changes.unsettled:
        differs = "differs" if len(changes.unsettled) == 1 else "differ"
        every = f" ({', '.join(changes.unsettled)} {differs} in every run)"
    if changes.code_changed:
        changed = f"the code and its {' and '.join(other)} changed" if other else "the code changed"
        return changed + every
    if other:
        return f"same code, other {' and '.join(other)}{every}"
    if changes.definitions_unrecorded:
        return "the same cell (the code of other cells it uses was not recorded before)" + every
    return "same code" + every


def _summary(changes: Changes, verdict: str | None) -> str:
    parts = [
        _code_words(changes),
        "same settings" if not changes.settings else "the DataLoader settings changed",
        "same machine" if not changes.environment else "the environment changed",
    ]
    head = ", ".join(parts)
    if changes.only_load:
        said: list[str] = []
        moved: list[bool] = []  # per part compared with a known baseline: did it get busier?
        if changes.load is not None and changes.load_share is not None:
            said.append(
                f"other processes used {fmt_share(changes.load_share)} of the CPUs during this run"
            )
            moved.append(changes.load_share >= (changes.baseline_load_share or 0.0))
        if changes.steal is not None and changes.steal_share is not None:
            said.append(_steal_phrase(changes.steal_share))
            if changes.baseline_steal_share is not None:
                moved.append(changes.steal_share >= changes.baseline_steal_share)
        text = f"{head}; {' and '.join(said)}"
        if verdict == "slower" and any(moved):
            return text + ": the slowdown is the machine's, not your code's."
        if verdict == "faster" and moved and not any(moved):
            return text + ": the speed-up is the machine's, not your code's."
        return text + "."
    if not (
        changes.code_changed
        or changes.arguments
        or changes.values
        or changes.settings
        or changes.environment
    ):
        return f"{head}, same machine load."
    return head + "."
