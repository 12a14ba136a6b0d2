"""The shifts of a name's step time in words: the marks and lines of ``%traceml history --name``
and the outputs of ``python -m traceml_nb check --history`` (text, markdown, JUnit XML)."""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.findings import Changes
from ..analysis.formatting import fmt_ms, fmt_share, signed_pct
from ..analysis.thresholds import CHANGE_MIN_RUNS
from ..session.shifts import ERROR, SLOWDOWN, TOO_SHORT, HistoryCheck, NameShifts, Shift
from .check_report import CheckReport, GateReport

_ICON = {"pass": "\u2705", SLOWDOWN: "\u274c", TOO_SHORT: "\u26a0\ufe0f", ERROR: "\u26a0\ufe0f"}
#: The check's statuses as ``check``'s JUnit report reads them (a short history is skipped).
_AS_CHECK = {TOO_SHORT: "no baseline"}


def _went(item: str) -> str:
    """``num_workers 4 → 0`` as ``num_workers went 4 → 0`` (other items as they are)."""
    field, _, rest = item.partition(" ")
    return f"{field} went {rest}" if "\u2192" in rest else item


def changes_clause(changes: Changes) -> str:
    """What came with a shift, as a clause: ``where the DataLoader's num_workers went 4 → 0``;
    ``with the same code, settings and environment`` when nothing stored changed."""
    parts = []
    if changes.settings:
        parts.append("the DataLoader's " + " and ".join(_went(s) for s in changes.settings))
    if changes.code:
        first = changes.code[0]
        more = f" and {len(changes.code) - 1} more lines" if len(changes.code) > 1 else ""
        parts.append(f"the code changed ({first}{more})")
    elif changes.definitions:
        parts.append(f"the notebook code it uses changed ({changes.definitions[0]})")
    elif changes.script is not None:
        parts.append("the script's source changed")
    if changes.arguments is not None:
        names = changes.argument_names
        parts.append(
            f"the script's argument{'s' if len(names) > 1 else ''} {', '.join(names)} changed"
            if names
            else "the script's arguments changed"
        )
    if changes.values:
        parts.append(" and ".join(changes.values))
    if changes.environment:
        parts.append(" and ".join(_went(s) for s in changes.environment))
    if changes.load_share is not None and changes.load is not None:
        used = fmt_share(changes.load_share)
        parts.append(
            f"other processes used {used} of the CPUs{_before(changes.baseline_load_share)}"
        )
    if changes.steal_share is not None and changes.steal is not None:
        took = fmt_share(changes.steal_share)
        parts.append(
            f"the hypervisor took {took} of the CPUs{_before(changes.baseline_steal_share)}"
        )
    if not parts:
        return "with the same code, settings and environment"
    return "where " + ", ".join(parts)


def _before(share: float | None) -> str:
    """`` (60% before)``: the load before the shift, beside the load after it (a lower one
    after read as the machine's blame)."""
    return f" ({fmt_share(share)} before)" if share is not None else ""


#: The lines name the batch sizes a history went through up to this many, else their range.
MAX_BATCH_SIZES_NAMED = 4


def measure(history: NameShifts) -> str:
    """What the series is: ``time per sample`` where the runs' batch sizes differ, else
    ``step time``."""
    return "time per sample" if history.per_sample else "step time"


def measure_why(history: NameShifts) -> str:
    """:func:`measure` with why where it is per sample: ``time per sample (the batch size went
    32 → 64)``."""
    if not history.per_sample:
        return measure(history)
    sizes = [s for s in history.batch_sizes if s is not None]
    levels = [a for a, b in zip(sizes, [*sizes[1:], None], strict=True) if a != b]
    if len(levels) > MAX_BATCH_SIZES_NAMED:
        return f"time per sample (batch sizes from {min(sizes)} to {max(sizes)})"
    went = " \u2192 ".join(map(str, levels))
    return f"time per sample (the batch size went {went})"


def shift_line(shift: Shift, history: NameShifts) -> str:
    """``step time +18% from @41 (12.1 ms → 14.3 ms), where the DataLoader's num_workers went
    4 → 0`` (``time per sample …`` where ``history`` is per sample)."""
    p = shift.point
    return (
        f"{measure(history)} {signed_pct(p.change)} from @{shift.after.id} "
        f"({fmt_ms(p.before_ms)} \u2192 {fmt_ms(p.after_ms)}), {changes_clause(shift.changes)}"
    )


def shift_mark(shift: Shift) -> str:
    """The mark in the history table on a shift's first run: ``▲ +18%`` slower, ``▼ −20%``
    faster."""
    arrow = "\u25b2" if shift.point.change > 0 else "\u25bc"
    return f"{arrow} {signed_pct(shift.point.change)}"


def given_words(history: NameShifts) -> str:
    """``, given the same arguments (--model)`` where values told the name's runs apart and
    the series holds those given the latest run's (:attr:`NameShifts.split_by`), else ''."""
    from ..session.baselines import SAME_VALUES
    from ..session.conclusion import values_words

    return values_words(SAME_VALUES, history.split_by) if history.split_by else ""


def shift_lines(history: NameShifts) -> list[str]:
    """The lines under ``%traceml history --name``'s table: one per shift, or why none."""
    shifts = history.shifts
    where = f" on {history.hardware}" if history.hardware else ""
    where += given_words(history) + (" (marked \u2190)" if history.split_by else "")
    if not shifts.judged:
        return [
            f"change points: {shifts.runs} run{'s' if shifts.runs != 1 else ''} with a step "
            f"time{where}; {shifts.needed} needed to look for shifts"
        ]
    if not history.found:
        return [
            f"change points: no shift of the {measure_why(history)} over {shifts.runs} "
            f"runs{where} (a shift shows once {CHANGE_MIN_RUNS} runs follow it)"
        ]
    of = f" of the {measure_why(history)}" if history.per_sample else ""
    return [f"change points{of} over {shifts.runs} runs{where}:"] + [
        f"  {shift_line(s, history)}" for s in history.found
    ]


@dataclass(repr=False)
class HistoryCheckReport(GateReport):
    """``python -m traceml_nb check --history``: the :class:`~traceml_nb.session.shifts.
    HistoryCheck` (``result``) and its renderings; ``exit_code`` 0/1/2 as the CLI exits."""

    result: HistoryCheck

    def text(self) -> str:
        """The one-paragraph verdict."""
        r = self.result
        if r.history is None:
            return f"ERROR: cannot check the history of {r.name!r}: {r.error}."
        h = r.history
        where = f" on {h.hardware}" if h.hardware else ""
        where += given_words(h)
        over = f"over its {h.shifts.runs} runs{where}"
        allowed = f"the {fmt_share(r.max_slowdown)} allowed"
        if r.status == TOO_SHORT:
            need = h.shifts.needed - h.shifts.runs
            left = "; ".join(f"{n} {why}" for why, n in h.left_out.items())
            return (
                f"NO VERDICT: {r.name!r} has {h.shifts.runs} completed run"
                f"{'s' if h.shifts.runs != 1 else ''} with a step time{where}"
                + (f" ({left} left out)" if left else "")
                + f"; change points need {h.shifts.needed} ({need} more)."
            )
        shift = r.shift
        if shift is None:
            return (
                f"OK: {r.name!r}: no shift of the {measure_why(h)} {over} (a shift shows once "
                f"{CHANGE_MIN_RUNS} runs follow it)."
            )
        line = shift_line(shift, h)
        since = f"the {shift.runs_since} runs since hold it"
        p = f"p = {shift.point.p_value:.3f}"
        if r.status == SLOWDOWN:
            return (
                f"REGRESSION: {r.name!r} {line}; {since}, beyond {allowed} "
                f"(change points {over}, {p})."
            )
        kind = "not a slowdown" if shift.point.change <= 0 else f"within {allowed}"
        return f"OK: {r.name!r} latest shift: {line}; {kind} (change points {over}, {p})."

    def markdown(self) -> str:
        """A heading, the verdict, and the shifts as a table (for a CI job summary)."""
        r = self.result
        head = f"### {_ICON.get(r.status, '')} traceml_nb check --history: `{r.name}` \u2014 "
        lines = [head + r.status, "", self.text(), ""]
        found = r.history.found if r.history is not None else []
        if found:
            lines += [
                "| from | before | after | change | what came with it |",
                "|---|---|---|---|---|",
            ]
            for s in found:
                cells = [
                    f"@{s.after.id}",
                    fmt_ms(s.point.before_ms),
                    fmt_ms(s.point.after_ms),
                    signed_pct(s.point.change),
                    changes_clause(s.changes),
                ]
                lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
            lines.append("")
        return "\n".join(lines)

    def _as_check(self) -> CheckReport:
        """The same verdict as ``check``'s report, whose JUnit writer it reuses."""
        from ..session.check import CheckResult

        r = self.result
        return CheckReport(
            CheckResult(
                exit_code=r.exit_code,
                status=_AS_CHECK.get(r.status, r.status),
                name=r.name,
                why=self.text(),
                max_slowdown=r.max_slowdown,
                store_path=r.store_path,
            )
        )

    def junit(self) -> str:
        """JUnit XML as ``check`` writes it: a failure for a slowdown that holds, a skip for a
        history too short, an error for a store that cannot be read."""
        text: str = self._as_check().junit()
        return text
