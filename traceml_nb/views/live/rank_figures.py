"""The ranks a run launched, as the live views follow them: each rank's recent figures and the
slowest rank, whose steps the header counts (:mod:`.view` and :mod:`.handle` alike).

Pure: the ranks' records (:class:`~traceml_nb.engine.record.RankRecord`, as the kernel has received
their rows so far) in, figures and strings out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...analysis.formatting import fmt_ms, fmt_share
from ...analysis.steps import rule_of
from ...analysis.stragglers import RankFigures, slowest_rank
from ...engine.rank_record import RankRecord
from .data import RECENT_STEPS, StepRows

#: Step-table rows read for a rank's latest :data:`~.data.RECENT_STEPS` steps: a step is
#: one row of its source, and the rows of the other sources (the fetches of a loop whose steps
#: are its optimizer steps) come in between.
RECENT_ROWS = 4 * RECENT_STEPS


def recent_figures(rec: RankRecord, steps: int) -> RankFigures:
    """``rec``'s figures for the header: ``steps`` the steps it made so far; the medians and the
    data wait share over its latest :data:`RECENT_STEPS` steps (None before any)."""
    record = rec.record
    snap = record.snapshot(max(0, len(record.steps) - RECENT_ROWS), samples=False)
    rows = StepRows.of_rule(snap.steps, rule_of(snap))
    return figures_of(rec, steps, rows.wall_ns / 1e6, rows.wait_ns / 1e6)


def figures_of(
    rec: RankRecord,
    steps: int,
    wall_ms: Sequence[float] | np.ndarray,
    wait_ms: Sequence[float] | np.ndarray,
) -> RankFigures:
    """``rec``'s figures from its steps' times in milliseconds, in step order: the medians and
    the data wait share over the latest :data:`RECENT_STEPS` of them."""
    walls = np.asarray(wall_ms, dtype=np.float64)[-RECENT_STEPS:]
    waits = np.asarray(wait_ms, dtype=np.float64)[-RECENT_STEPS:]
    figures = RankFigures(rec.rank, rec.status, rec.error, steps, launch=rec.launch, pid=rec.pid)
    if len(walls):
        figures.step_ms_median = float(np.median(walls))
        figures.data_wait_ms_median = float(np.median(waits))
        total = float(walls.sum())
        figures.data_wait_share = float(waits.sum()) / total if total > 0 else None
    return figures


def slowest_parts(figures: Sequence[RankFigures]) -> tuple[RankFigures, str, str] | None:
    """The rank the header follows and its two parts: who ("rank 1 (slowest of 2)") and its
    figures ("25.3 ms a step, data wait 85%: the straggler"); None before any rank has steps."""
    found = slowest_rank(figures)
    if found is None:
        return None
    f, straggler = found
    count = len(figures)
    who = f"{f.label} (slowest of {count})" if count > 1 else f.label
    said = f"{fmt_ms(f.step_ms_median)} a step, data wait {fmt_share(f.data_wait_share)}"
    return f, who, said + (": the straggler" if straggler else "")
