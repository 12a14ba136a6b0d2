"""What an executed notebook of ours must hold: a report under every ``%%traceml`` cell."""

from __future__ import annotations


def traced_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%traceml")]


def has_report(cell) -> bool:
    return any(
        o.output_type == "display_data"
        and "traceml-report" in o["data"].get("text/html", "")
        and o["data"].get("text/plain", "").startswith("traceml report:")
        for o in cell.outputs
    )


def assert_keeps_its_reports(nb) -> None:
    """Every ``%%traceml`` cell of the executed notebook ``nb`` kept its report."""
    cells = traced_cells(nb)
    assert cells, "no %%traceml cell"
    for cell in cells:
        assert has_report(cell), f"no report under:\n{cell.source[:200]}"
