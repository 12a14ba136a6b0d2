"""Which two runs a comparison means: runs of the history by number or name, stored runs by id.

``%traceml compare 2 5``, ``compare baseline tuned``, ``compare @17 3``: a number is a run of
the kernel's history (``3``, ``"#3"``), a name the latest run of that name, ``@N`` the stored
run with id N.
"""

from __future__ import annotations

from .environment import hardware_class
from .history import History, RunEntry
from .store import Store, StoreError


def pair(history: History, before: int | str, after: int | str) -> tuple[RunEntry, RunEntry, str]:
    """The two runs of ``history`` to compare, and a note ('' when there is nothing to say).
    Where both refer to the same run, a name among them is taken as the latest *other* run of
    that name (the note says which), and ``KeyError`` where there is none."""
    first, second = history.get(before), history.get(after)
    if first is not second:
        return first, second, ""
    if not history.is_number(before):
        first = history.get(before, other_than=second)
        which, ref, run = "first", before, first
    elif not history.is_number(after):
        second = history.get(after, other_than=first)
        which, ref, run = "second", after, second
    else:
        raise KeyError(f"{before!r} and {after!r} are the same run, {first.label}")
    note = (
        f"the {which} run, {ref!r}, would have been the other run itself: "
        f"compared with the latest other run of that name, {run.label}"
    )
    return first, second, note


def resolve_pair(
    history: History, before: int | str, after: int | str, store: Store | None
) -> tuple[RunEntry, RunEntry, str]:
    """Like :func:`pair`, where a ref may also be a stored run, ``@17`` (read from ``store``,
    None: storing is off); the note says when the two runs are on different hardware
    classes."""
    if not (str(before).startswith("@") or str(after).startswith("@")):
        first, second, note = pair(history, before, after)
    else:
        first, second = (_resolve(history, ref, store) for ref in (before, after))
        note = ""
    a, b = hardware_class(first.environment), hardware_class(second.environment)
    if first.environment and second.environment and a != b:
        across = f"across hardware classes: {a} \u2192 {b}"
        note = f"{across}; {note}" if note else across
    return first, second, note


def _resolve(history: History, ref: int | str, store: Store | None) -> RunEntry:
    text = str(ref).strip()
    if not text.startswith("@"):
        return history.get(text)
    if store is None:
        raise KeyError(f"{text}: storing is off, so there are no stored runs")
    if not text[1:].isdigit():
        raise KeyError(f"{text!r} is not a stored run id (@ and a number)")
    try:
        entry = store.get(int(text[1:]))
    except StoreError as exc:
        raise KeyError(str(exc)) from None
    return entry
