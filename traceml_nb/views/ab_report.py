"""The A/B gate's outputs: a paragraph and a table of the rounds as text, markdown for a CI job
summary, JUnit XML, and the progress lines printed while it runs."""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from ..analysis.formatting import fmt_confidence, fmt_ms, fmt_s, signed_pct, signed_pct_fine
from ..analysis.thresholds import AB_FALSE_ALARM_PER_LOOK, AB_MISS_PER_LOOK, MIN_AB_ROUNDS
from ..session.ab import ERROR, INCONCLUSIVE, NOT_SLOWER, REGRESSION, AbResult
from .check_report import _ICON, GateReport
from .comparison_words import as_sentence, batch_change_words, fmt_pct_plain

_HEADS = {
    REGRESSION: "REGRESSION",
    NOT_SLOWER: "OK",
    INCONCLUSIVE: "INCONCLUSIVE",
    ERROR: "ERROR",
}


def base_words(r: AbResult) -> str:
    """The base as a sentence names it: ``main`` or ``the base command``."""
    return r.base_label if r.base_label is not None else "the base command"


def head_words(r: AbResult) -> str:
    """The head: ``HEAD`` (``HEAD with uncommitted changes``), or ``the current tree`` outside a
    git repository."""
    if r.head_commit is None:
        return "the current tree"
    return "HEAD with uncommitted changes" if r.head_dirty else "HEAD"


def _head_at(r: AbResult) -> str:
    """``at HEAD`` / ``in the current tree``."""
    return "in the current tree" if r.head_commit is None else f"at {head_words(r)}"


def _sides(r: AbResult) -> str:
    """``at HEAD than at main`` / ``in the current tree than with the base command``."""
    than = f"at {base_words(r)}" if r.base_label is not None else "with the base command"
    return f"{_head_at(r)} than {than}"


def _rounds_words(r: AbResult) -> str:
    n = len(r.rounds)
    return (
        f"{n} round{'s' if n != 1 else ''} ({r.runs} runs, ABBA), paired per round: the "
        "machine's drift cancels"
    )


def paragraph(r: AbResult) -> str:
    """The verdict in one paragraph."""
    if r.status == ERROR or r.judgement is None:
        why = r.error or "the gate stopped before its first look"
        return f"ERROR: no verdict on {r.name!r} ({head_words(r)} against {base_words(r)}): {why}."
    j = r.judgement
    move, per_sample = f"step time {fmt_ms(r.a_ms)} \u2192 {fmt_ms(r.b_ms)}", ""
    sizes = r.batch_sizes
    if sizes is not None and r.a_ms and r.b_ms:
        move = f"time per sample {fmt_ms(r.a_ms / sizes[0])} \u2192 {fmt_ms(r.b_ms / sizes[1])}"
        per_sample = f" {as_sentence(batch_change_words(sizes, r.a_ms, r.b_ms))}"
    allowed = fmt_pct_plain(r.max_slowdown)
    sure = fmt_confidence(1 - AB_FALSE_ALARM_PER_LOOK)
    if r.status == REGRESSION:
        low = j.bound(AB_FALSE_ALARM_PER_LOOK)
        return (
            f"REGRESSION: {r.name!r} is slower {_sides(r)}: {move} "
            f"({signed_pct(j.change)}; at least {signed_pct_fine(low)} with {sure} confidence, and "
            f"more than half the {allowed} allowed), {_rounds_words(r)}.{per_sample}"
        )
    if r.status == NOT_SLOWER:
        high = j.bound(1 - AB_MISS_PER_LOOK)
        return (
            f"OK: {r.name!r} is not slower {_sides(r)}: {move} "
            f"({signed_pct(j.change)}; at most {signed_pct_fine(high)} with "
            f"{fmt_confidence(1 - AB_MISS_PER_LOOK)} confidence: a slowdown of {allowed} is ruled "
            f"out), {_rounds_words(r)}.{per_sample}"
        )
    low, high = j.bound(AB_FALSE_ALARM_PER_LOOK), j.bound(1 - AB_MISS_PER_LOOK)
    more = j.more_needed
    if more is None:
        decide = "a change this small cannot be told from this noise in a few more rounds"
    else:
        decide = (
            f"about {more} more round{'s' if more != 1 else ''} would decide "
            f"(--rounds {r.rounds_allowed + more}), were the change and the noise to stay"
        )
    return (
        f"INCONCLUSIVE: {r.name!r} {_head_at(r)} against {base_words(r)} after "
        f"{_rounds_words(r)}: {move} ({signed_pct(j.change)}, between "
        f"{signed_pct_fine(low)} and {signed_pct_fine(high)}): neither slower nor a slowdown of "
        f"{allowed} ruled out; {decide}.{per_sample}"
    )


def _round_cells(r: AbResult) -> list[list[str]]:
    rows = []
    for rd in r.rounds:
        rows.append(
            [
                str(rd.index),
                " ".join(rd.order),
                f"{fmt_ms(rd.a.step_ms)} @{rd.a.stored_id}",
                f"{fmt_ms(rd.b.step_ms)} @{rd.b.stored_id}",
                signed_pct(rd.change) if abs(rd.change) >= 0.005 else f"{rd.change * 100:+.1f}%",
            ]
        )
    return rows


def _column_heads(r: AbResult) -> list[str]:
    a = f"A: {base_words(r)}"
    if r.base_commit:
        a += f" ({r.base_commit[:8]})"
    b = f"B: {head_words(r)}"
    if r.head_commit:
        b += f" ({r.head_commit[:8]})"
    return ["round", "order", a, b, "B/A" if r.batch_sizes is None else "B/A per sample"]


def rounds_table(r: AbResult) -> str:
    """The rounds as a plain-text table (empty without rounds)."""
    if not r.rounds:
        return ""
    rows = [_column_heads(r), *_round_cells(r)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines)


def rule_words(r: AbResult) -> str:
    """The decision rule in one sentence, with its levels."""
    allowed = fmt_pct_plain(r.max_slowdown)
    return (
        f"Decision: a paired t over the rounds' ln(B/A), looked at after every round from "
        f"{MIN_AB_ROUNDS} on (at most {r.rounds_allowed}): slower when the lower bound at "
        f"{fmt_confidence(1 - AB_FALSE_ALARM_PER_LOOK)} is above 0 and the change is at least half "
        f"of {allowed}; not slower when the upper bound at "
        f"{fmt_confidence(1 - AB_MISS_PER_LOOK)} is below +{allowed}."
    )


def progress_line(event: str, r: AbResult) -> str:
    """A line for the CI log: at the start (what runs), after each round (its two medians)."""
    if event == "start":
        if r.base_label is not None:
            short = f" ({r.base_commit[:8]})" if r.base_commit else ""
            a = f"{r.base_label}{short} in a temporary git worktree"
        else:
            a = "the base command"
        return (
            f"traceml_nb ab {r.name!r}: A = {a}, B = {head_words(r)}; up to "
            f"{r.rounds_allowed} rounds, ABBA, stopping once decided (from {MIN_AB_ROUNDS} "
            "rounds on)"
        )
    rd = r.rounds[-1]
    line = (
        f"round {rd.index}/{r.rounds_allowed}: A {fmt_ms(rd.a.step_ms)}, B {fmt_ms(rd.b.step_ms)}"
        f" (B/A {signed_pct(rd.change)}{' per sample' if rd.per_sample else ''}; "
        f"{fmt_s(rd.a.wall_s + rd.b.wall_s)})"
    )
    j = r.judgement
    if j is not None:
        line += f"; {len(r.rounds)} rounds: {signed_pct(j.change)}, {j.verdict}"
    return line


@dataclass(repr=False)
class AbReport(GateReport):
    """The :class:`~traceml_nb.session.ab.AbResult` (``result``) and its renderings;
    ``exit_code`` 0/1/2/3 as the CLI exits."""

    result: AbResult

    def text(self) -> str:
        """The paragraph, then the rounds' table (or the failing command's output tail)."""
        r = self.result
        parts = [paragraph(r)]
        if r.output_tail:
            parts.append("Its output ended with:\n" + "\n".join(f"    {x}" for x in r.output_tail))
        table = rounds_table(r)
        if table:
            parts.append(table)
        return "\n\n".join(parts)

    def markdown(self) -> str:
        """A heading, the paragraph, the rounds' table and the rule (for a CI job summary)."""
        r = self.result
        icon = _ICON.get("pass" if r.status == NOT_SLOWER else r.status, "")
        lines = [f"### {icon} traceml_nb ab: `{r.name}` \u2014 {r.status}", "", paragraph(r), ""]
        if r.output_tail:
            lines += ["Its output ended with:", "", "```", *r.output_tail, "```", ""]
        if r.rounds:
            heads = _column_heads(r)
            lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
            for cells in _round_cells(r):
                lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
            lines += ["", rule_words(r), ""]
        return "\n".join(lines)

    def junit(self) -> str:
        """JUnit XML: one test case named after the run; a failure for a regression, a skip for
        an inconclusive gate (no verdict on the code: the exit code 3 lets the job decide), an
        error for a usage error or a command that failed or recorded no run."""
        r = self.result
        text = paragraph(r)
        message = quoteattr(text)
        body = ""
        if r.status == REGRESSION:
            body = f'<failure message={message} type="regression">{escape(text)}</failure>'
        elif r.status == INCONCLUSIVE:
            body = f"<skipped message={message}/>"
        elif r.status == ERROR:
            detail = "\n".join([text, *r.output_tail])
            body = f'<error message={message} type="no verdict">{escape(detail)}</error>'
        counts = {
            "failures": int(r.status == REGRESSION),
            "errors": int(r.status == ERROR),
            "skipped": int(r.status == INCONCLUSIVE),
        }
        attrs = " ".join(f'{k}="{v}"' for k, v in counts.items())
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuites><testsuite name="traceml_nb ab" tests="1" {attrs} '
            f'time="{r.wall_s:.3f}"><testcase classname="traceml_nb.ab" name={quoteattr(r.name)} '
            f'time="{r.wall_s:.3f}">{body}<system-out>{escape(self.text())}</system-out>'
            "</testcase></testsuite></testsuites>\n"
        )
