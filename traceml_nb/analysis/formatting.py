"""How numbers are written everywhere: verdicts, comparisons, the report, the live views and the
history table all use these (one place, so that 1500 ms reads "1.5 s" wherever it appears)."""

from __future__ import annotations

from collections.abc import Sequence

MINUS = "\u2212"  #: the typographic minus sign used in deltas


def fmt_ms(ms: float | None) -> str:
    """A duration given in milliseconds, three significant digits: 3.16 ms, 316 ms; from one
    second on in seconds (1.5 s)."""
    if ms is None:
        return "unavailable"
    if abs(ms) >= 1000:
        return fmt_s(ms / 1000)
    if abs(ms) >= 100:
        return f"{ms:.0f} ms"
    return f"{ms:.3g} ms"


def fmt_run_span(labels: Sequence[tuple[str, int | None]]) -> str:
    """Runs named by ``(prefix, number)`` (``("@", 3)``: stored run 3; ``("#", 2)``: run 2 of
    the session), in order, as a span that names no run it does not hold: consecutive numbers
    of one prefix as a range, the rest listed: ``@3``, ``@3–@7``, ``@1, @3``,
    ``@1–@3, @5``."""
    parts: list[str] = []
    i = 0
    while i < len(labels):
        j = i
        while (
            j + 1 < len(labels)
            and labels[j + 1][0] == labels[i][0]
            and _follows(labels[j + 1][1], labels[j][1])
        ):
            j += 1
        first, last = labels[i], labels[j]
        parts.append(f"{first[0]}{first[1]}" + (f"–{last[0]}{last[1]}" if j > i else ""))
        i = j + 1
    return ", ".join(parts)


def _follows(number: int | None, before: int | None) -> bool:
    return number is not None and before is not None and number == before + 1


def fmt_s(seconds: float) -> str:
    """A duration given in seconds: 0.84 s, 12.3 s, 633 s; from an hour on, 1 h 02 min."""
    if seconds >= 3600:
        hours, rest = divmod(int(round(seconds)), 3600)
        return f"{hours} h {rest // 60:02d} min"
    if abs(seconds) >= 100:
        return f"{seconds:.0f} s"
    return f"{seconds:.3g} s"


def fmt_share(share: float | None) -> str:
    """A fraction 0..1 as a percentage: 44%, 0.4%."""
    if share is None:
        return "unavailable"
    pct = share * 100
    if 0 < abs(pct) < 1:
        return f"{pct:.1f}%"
    return f"{pct:.0f}%"


def fmt_share_below(share: float, threshold: float) -> str:
    """``share``, known to be below ``threshold``, written so that it reads below it: one
    decimal where the whole percent would round up to the threshold (14.9%, not 15%)."""
    text = fmt_share(share)
    if text == fmt_share(threshold):
        text = f"{share * 100:.1f}%"
    return text


def plural(count: float, noun: str) -> str:
    """``1 step``, ``6 steps``, ``1,200 steps``; a median count rounds (1.5 workers: 2)."""
    whole = round(count)
    return f"{whole:,} {noun}{'' if whole == 1 else 's'}"


def fmt_pct(pct: float | None) -> str:
    """A percentage 0..100 (or more for CPU, 100 = one core): 51%."""
    return "unavailable" if pct is None else f"{pct:.0f}%"


def signed_pct(change: float) -> str:
    """A relative change (0.76 = +76%) with a sign: +76%, −43%, ±0%."""
    pct = round(change * 100)
    if pct == 0:
        return "\u00b10%"
    return f"+{pct}%" if pct > 0 else f"{MINUS}{-pct}%"


def fmt_confidence(level: float) -> str:
    """A confidence level as a percentage: 0.995 → '99.5%', 0.9 → '90%'."""
    return f"{level * 100:.4g}%"


def signed_pct_fine(change: float) -> str:
    """A relative change with a sign and one decimal below 10% (a confidence bound, where
    +0.3% and ±0% say different things): +0.3%, −3.1%, +17%."""
    pct = change * 100
    if abs(pct) >= 9.95:
        return signed_pct(change)
    if round(pct, 1) == 0:
        return "\u00b10.0%"
    return f"+{pct:.1f}%" if pct > 0 else f"{MINUS}{-pct:.1f}%"


def signed_points(points: float) -> str:
    """A change of a percentage, in percentage points: +42 pts, −3 pts."""
    value = round(points)
    if value == 0:
        return "\u00b10 pts"
    return f"+{value} pts" if value > 0 else f"{MINUS}{-value} pts"


def fmt_mb(mb: float | None) -> str:
    """Memory in MiB: 512 MiB, 14.6 GiB."""
    if mb is None:
        return "unavailable"
    if mb >= 1024:
        return f"{mb / 1024:.1f} GiB"
    return f"{mb:.0f} MiB"


def fmt_rate(value: float | None, unit: str) -> str:
    """A rate with three significant digits: 25.3 samples/s, 1234 samples/s."""
    if value is None:
        return "unavailable"
    if value >= 100:
        return f"{value:.0f} {unit}"
    return f"{value:.3g} {unit}"
