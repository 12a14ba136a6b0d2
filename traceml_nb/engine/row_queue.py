"""The step rows the segmenter (:mod:`traceml_nb.engine.segment`) made and has not written yet:
queued as it applies a batch of events, written to the step table in one atomic ``extend``
(:meth:`~traceml_nb.engine.step_table.StepTable.extend`) at the batch's end, so that a reader
sees all of them or none."""

from __future__ import annotations

from .open_steps import Row
from .step_table import StepTable


class RowQueue:
    """Rows ``(start_ns, wall_ns, wait_ns, batch, source, flags)``, with each one's phases
    (``PHASE_COLUMNS``; None: none) and the elements of the batches it trained on (-1: not
    told), in the order the segmenter made them."""

    __slots__ = ("table", "rows", "phases", "elements")

    def __init__(self, table: StepTable) -> None:
        self.table = table
        self.rows: list[tuple[int, int, int, int, int, int]] = []
        self.phases: list[tuple[int, int, int, int] | None] = []
        self.elements: list[int] = []

    def add(self, row: Row) -> None:
        """Queue ``row`` (times relative to the run start)."""
        self.rows.append(row[0])
        self.phases.append(row[1])
        self.elements.append(row[2])

    @property
    def next_index(self) -> int:
        """The index in the table the next row queued will have, once written."""
        return len(self.table) + len(self.rows)

    def write(self) -> None:
        """Write the queued rows in one go, and queue none."""
        if self.rows:
            self.table.extend(self.rows, self.phases, self.elements)
            self.rows, self.phases, self.elements = [], [], []
