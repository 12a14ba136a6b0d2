"""The static step chart: an inline SVG of each step's data wait and the rest of the step.

No JavaScript, no widget: the saved notebook shows it wherever HTML renders.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from ..analysis.formatting import fmt_ms
from .report_content import StepChart

#: Most bars the static chart draws; longer runs are averaged into this many buckets.
MAX_BARS = 400

WAIT_COLOUR = "#e8833a"
COMPUTE_COLOUR = "#4c78a8"


@dataclass(frozen=True)
class Bars:
    """The chart's bars: mean step time and mean data wait (ms) of consecutive step buckets."""

    wall_ms: list[float]
    data_wait_ms: list[float]
    steps_per_bar: float  #: average number of steps behind one bar
    first_step: list[int]  #: 1-based number of each bar's first step


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def bars_of(
    wall_ms: Sequence[float], data_wait_ms: Sequence[float], max_bars: int = MAX_BARS
) -> Bars:
    """Average consecutive steps into at most ``max_bars`` buckets of near-equal size.

    Means (not medians) so that a bar's area stays proportional to the time it stands for.
    """
    n = len(wall_ms)
    bars = min(n, max_bars)
    walls: list[float] = []
    waits: list[float] = []
    firsts: list[int] = []
    for b in range(bars):
        lo, hi = b * n // bars, (b + 1) * n // bars
        walls.append(_mean(wall_ms[lo:hi]))
        waits.append(_mean(data_wait_ms[lo:hi]))
        firsts.append(lo + 1)
    return Bars(walls, waits, n / bars if bars else 0.0, firsts)


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k that is ≥ ``value``."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for mult in (1, 2, 2.5, 5, 10):
        top = mult * 10**exp
        if top >= value * (1 - 1e-9):
            return float(top)
    return float(10 ** (exp + 1))


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def step_chart_svg(
    chart: StepChart, *, width: int = 720, height: int = 190, max_bars: int = MAX_BARS
) -> str:
    """An inline SVG of step time split into data wait and the rest of the step, per step.

    Bars above 3× the 95th percentile (a slow first batch, say) are clipped to keep the
    steady steps readable; a clipped bar gets a dark cap and the caption says so.
    """
    bars = bars_of(chart.wall_ms, chart.data_wait_ms, max_bars)
    n_bars = len(bars.wall_ms)
    if n_bars == 0:
        return ""
    left, right, top, bottom = 56, 8, 26, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    tallest = max((v for v in bars.wall_ms if not math.isnan(v)), default=0.0)
    typical = _quantile(bars.wall_ms, 0.95)
    clip = tallest > 3 * typical > 0
    y_max = _nice_ceiling(1.5 * typical if clip else tallest)
    base = top + plot_h

    def y(ms: float) -> float:
        return base - min(ms, y_max) / y_max * plot_h

    slot = plot_w / n_bars
    bar_w = slot * 0.8 if slot >= 6 else slot
    wait_path: list[str] = []
    rest_path: list[str] = []
    caps: list[str] = []
    for i, (wall, wait) in enumerate(zip(bars.wall_ms, bars.data_wait_ms, strict=True)):
        if math.isnan(wall):
            continue
        x = left + i * slot
        wait = 0.0 if math.isnan(wait) else min(wait, wall)
        y_wait, y_wall = y(wait), y(wall)
        if wait > 0:
            wait_path.append(f"M{x:.1f} {base:.1f}V{y_wait:.1f}h{bar_w:.1f}V{base:.1f}Z")
        rest_path.append(f"M{x:.1f} {y_wait:.1f}V{y_wall:.1f}h{bar_w:.1f}V{y_wait:.1f}Z")
        if wall > y_max:
            caps.append(f"M{x:.1f} {top:.1f}h{bar_w:.1f}v3h{-bar_w:.1f}Z")

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="11">',
        "<title>Step time per step: data wait and the rest of the step</title>",
    ]
    warmup_bars = _bars_covering(bars, chart.warmup_steps)
    if warmup_bars:
        x_end = left + warmup_bars * slot
        parts.append(
            f'<rect x="{left}" y="{top}" width="{x_end - left:.1f}" height="{plot_h}" '
            'fill="#888888" fill-opacity="0.15"/>'
            f'<text x="{left + 3}" y="{top + 11}" fill="#777777">warm-up</text>'
        )
    parts.append(
        f'<path d="{"".join(rest_path)}" fill="{COMPUTE_COLOUR}" shape-rendering="crispEdges"/>'
    )
    if wait_path:
        parts.append(
            f'<path d="{"".join(wait_path)}" fill="{WAIT_COLOUR}" shape-rendering="crispEdges"/>'
        )
    if caps:
        parts.append(f'<path d="{"".join(caps)}" fill="#222222"/>')
    # axes, ticks and labels
    parts.append(
        f'<path d="M{left} {top}V{base}H{left + plot_w}" stroke="#888888" fill="none"/>'
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" fill="#777777">'
        f"{fmt_ms(y_max)}</text>"
        f'<text x="{left - 4}" y="{top + plot_h / 2 + 4:.1f}" text-anchor="end" fill="#777777">'
        f"{fmt_ms(y_max / 2)}</text>"
        f'<text x="{left - 4}" y="{base + 4}" text-anchor="end" fill="#777777">0</text>'
        f'<text x="{left}" y="{height - 6}" fill="#777777">step 1</text>'
        f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end" fill="#777777">'
        f"step {len(chart.wall_ms):,}</text>"
    )
    legend = (
        f'<rect x="{left}" y="6" width="10" height="10" fill="{WAIT_COLOUR}"/>'
        f'<text x="{left + 14}" y="15" fill="#777777">data wait</text>'
        f'<rect x="{left + 80}" y="6" width="10" height="10" fill="{COMPUTE_COLOUR}"/>'
        f'<text x="{left + 94}" y="15" fill="#777777">rest of the step</text>'
    )
    note = []
    if bars.steps_per_bar > 1:
        note.append(f"each bar: mean of {bars.steps_per_bar:.1f} steps")
    if clip:
        note.append(f"bars above {fmt_ms(y_max)} clipped")
    if note:
        legend += (
            f'<text x="{left + plot_w}" y="15" text-anchor="end" fill="#777777">'
            f"{escape('; '.join(note))}</text>"
        )
    parts.append(legend)
    parts.append("</svg>")
    return "".join(parts)


def _bars_covering(bars: Bars, steps: int) -> int:
    """How many bars hold the first ``steps`` steps (a bar counts when it starts inside)."""
    return sum(1 for first in bars.first_step if first <= steps) if steps > 0 else 0
