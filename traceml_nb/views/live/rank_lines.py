"""The ranks a run launched, on the live charts: per rank one step-time line (solid) and one
data-wait line (dashed) on the step chart, and one throughput line.

A rank's lines are added to the charts on the first tick that has its steps (the ranks start
while the charts are already shown). Its points are a :class:`~.data.StepSeries` over
the rows the kernel has received from it (:class:`~traceml_nb.engine.record.RankRecord`), bounded and
downsampled like the run's own; its times are moved onto the run's clock (seconds since the
run started) by the difference of the two start times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from bokeh.models import ColumnDataSource

from ...analysis.stragglers import RankFigures
from ...engine.rank_record import RankRecord
from ...engine.record import RecordSnapshot
from ...engine.run import Run
from .charts import GPU_COLORS, LiveCharts
from .data import MAX_POINTS, SeriesUpdate, StepSeries
from .rank_figures import recent_figures

#: The columns of a rank's chart source (:data:`~.data.STEP_FIELDS` less the compute).
RANK_FIELDS = ("step", "t_s", "wait_ms", "step_ms", "samples_per_s", "steps_per_s")
RANK_COLORS = GPU_COLORS
STEP_TITLE = "Step time per rank (dashed: data wait)"


@dataclass
class RankLine:
    """One rank on the charts: its series, and its chart source once it has points."""

    rec: RankRecord
    series: StepSeries
    color: str
    source: ColumnDataSource | None = None

    @property
    def key(self) -> tuple[int, int]:
        return self.rec.launch, self.rec.rank

    @property
    def label(self) -> str:
        return RankFigures(self.rec.rank, launch=self.rec.launch).label


class RankLines:
    """The ranks of ``run`` (``Run.ranks``, growing while the run goes on) on ``charts``."""

    def __init__(self, run: Run, charts: LiveCharts, max_points: int = MAX_POINTS) -> None:
        self.run = run
        self.charts = charts
        self.max_points = max_points
        self.lines: dict[tuple[int, int], RankLine] = {}
        #: the throughput column the ranks' lines plot, chosen by the first rank's points:
        #: samples/s when its batch sizes are known, else steps/s
        self.rate_field: str | None = None

    def __bool__(self) -> bool:
        return bool(self.lines)

    @property
    def k(self) -> int:
        """The most steps a point of a rank's line stands for."""
        return max((line.series.k for line in self.lines.values()), default=1)

    def update(self, *, final: bool = False) -> list[tuple[ColumnDataSource, SeriesUpdate]]:
        """Each rank's points to send now, with the source they go to. A rank's first points
        come as the data of its new source (its lines are added to the charts), not here."""
        out = []
        for rec in list(getattr(self.run, "ranks", ())):
            key = (rec.launch, rec.rank)
            line = self.lines.get(key)
            if line is None:
                line = self.lines[key] = self._line(rec)
            upd = line.series.update(final=final)
            if upd is None or (line.source is None and not len(upd)):
                continue
            upd.data["t_s"] = upd.data["t_s"] + self._offset_s(rec)
            if line.source is None:
                self._draw(line, upd)
            else:
                out.append((line.source, upd))
        return out

    def figures(self) -> list[RankFigures]:
        """The header's figures of the ranks of the latest launch (:func:`recent_figures`)."""
        if not self.lines:
            return []
        latest = max(line.rec.launch for line in self.lines.values())
        return [
            recent_figures(line.rec, line.series.steps)
            for line in sorted(self.lines.values(), key=lambda line: line.rec.rank)
            if line.rec.launch == latest
        ]

    def steps_of(self, figures: RankFigures) -> int:
        """The steps the chart holds of the rank of ``figures``."""
        line = self.lines.get((figures.launch, figures.rank))
        return line.series.steps if line is not None else 0

    def _line(self, rec: RankRecord) -> RankLine:
        def read(row: int) -> RecordSnapshot:
            return rec.record.snapshot(row, samples=False)

        color = RANK_COLORS[len(self.lines) % len(RANK_COLORS)]
        return RankLine(rec, StepSeries(read, self.max_points), color)

    def _offset_s(self, rec: RankRecord) -> float:
        """Seconds from the run's start to the rank's (its times are from its own start)."""
        t0 = rec.record.t0_wall
        return t0 - self.run.record.t0_wall if t0 else 0.0

    def _draw(self, line: RankLine, first: SeriesUpdate) -> None:
        """The rank's source, holding its first points, and its lines on the charts."""
        charts = self.charts
        if self.rate_field is None:  # the first rank on the charts
            charts.make_room_for_ranks()
            known = not np.isnan(first.data["samples_per_s"][0])
            self.rate_field = "samples_per_s" if known else "steps_per_s"
            charts.rate_fig.yaxis.axis_label = "samples/s" if known else "steps/s"
        data = {name: np.asarray(first.data[name], dtype=np.float32) for name in RANK_FIELDS}
        line.source = source = ColumnDataSource(data)
        label = line.label
        step = charts.step_fig
        step.line("step", "step_ms", source=source, color=line.color, legend_label=label)
        step.line(
            "step",
            "wait_ms",
            source=source,
            color=line.color,
            line_dash="dashed",
            legend_label=label,
        )
        charts.rate_fig.line(
            "t_s", self.rate_field, source=source, color=line.color, legend_label=label
        )
        self._order_legends()

    def _order_legends(self) -> None:
        """The legends list the ranks in rank order, whichever rank's first steps came first."""
        order = {line.label: (line.rec.launch, line.rec.rank) for line in self.lines.values()}
        for fig in (self.charts.step_fig, self.charts.rate_fig):
            legend = fig.legend[0]
            legend.items = sorted(
                legend.items, key=lambda item: order.get(item.label.value, (-1, -1))
            )
