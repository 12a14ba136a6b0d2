"""A notebook executed by nbclient in a real kernel keeps the final report as a static output.

The kernel is the ``python3`` kernelspec of this virtualenv (``.venv/share/jupyter/kernels``);
jupyter_client starts it with the running interpreter, which the notebook's first cell prints
and the test checks.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).parent / "notebooks" / "magic_report.ipynb"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def executed():
    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.fail(
            "no python3 kernelspec: run `.venv/bin/python -m ipykernel install --sys-prefix`"
        )
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=120, allow_errors=False).execute()
    # what a saved notebook holds is what nbviewer, GitHub and a re-opened notebook show
    return nbformat.reads(nbformat.writes(nb), as_version=4)


def cell(nb, first_line: str):
    (found,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(first_line)]
    return found


def reports(code_cell) -> list[dict]:
    """The final-report outputs of a cell (display data with the report in both versions)."""
    return [
        o["data"]
        for o in code_cell.outputs
        if o.output_type == "display_data"
        and "traceml-report" in o["data"].get("text/html", "")
        and o["data"].get("text/plain", "").startswith("traceml report:")
    ]


def test_the_kernel_is_this_virtualenvs_python(executed):
    first = executed.cells[1]
    assert first.outputs[0]["text"].strip() == sys.executable


def test_report_is_saved_as_html_and_text_with_the_verdict(executed):
    baseline = cell(executed, "%%traceml --view none --name baseline")
    (report,) = reports(baseline)
    html, text = report["text/html"], report["text/plain"]
    assert "<svg" in html and "<script" not in html
    # 2 ms of loading per sample, no workers: every run of this loop is input-bound
    assert "input-bound" in html
    assert re.search(r"^Verdict: input-bound \((high|medium) confidence\): ", text, re.M)
    assert text.splitlines()[0].startswith('traceml report: #1 "baseline" completed in ')
    assert "GPU utilisation (median)" in text and "unavailable (" in text


def test_last_expression_comes_first_as_the_cells_result(executed):
    baseline = cell(executed, "%%traceml --view none --name baseline")
    kinds = [o.output_type for o in baseline.outputs]
    assert kinds == ["execute_result", "display_data"]
    assert baseline.outputs[0]["data"]["text/plain"] == "24"


def test_handle_view_ends_in_its_final_state(executed):
    handled = cell(executed, "%%traceml --view html --name handle-view")
    live, *rest = handled.outputs
    assert live["data"]["text/plain"].startswith(
        'traceml · "handle-view" · completed; the report follows'
    )
    assert len(reports(handled)) == 1 and len(rest) == 1


def test_auto_view_in_a_kernel_is_the_live_widget_and_the_report_stays_static(executed):
    auto = cell(executed, "%%traceml --name auto-view")
    mimes = {mime for o in auto.outputs if o.output_type == "display_data" for mime in o["data"]}
    assert "application/vnd.jupyter.widget-view+json" in mimes  # the live Bokeh widget
    assert len(reports(auto)) == 1  # and, whatever the widget shows later, the static report


def test_a_failing_cell_shows_the_partial_report_then_the_users_traceback(executed):
    failing = cell(executed, "%%traceml --view none --name failing")
    kinds = [o.output_type for o in failing.outputs]
    assert kinds == ["display_data", "error"]
    (report,) = reports(failing)
    assert "Partial report: the cell failed (ValueError: boom at step 5)" in report["text/plain"]
    error = failing.outputs[1]
    assert (error["ename"], error["evalue"]) == ("ValueError", "boom at step 5")
    traceback = ANSI.sub("", "\n".join(error["traceback"]))
    assert "----> 2 train(DataLoader(SlowDataset(), batch_size=4), fail_at=5)" in traceback
    assert "magic.py" not in traceback and "traceml_cell" not in traceback


def test_history_and_result_object_in_a_later_cell(executed):
    last = executed.cells[-1]
    assert last.outputs[0]["text"] == "completed 2 24\n"
    table = last.outputs[1]["data"]
    for label in ("#1 baseline", "#2 handle-view", "#3 auto-view", "#4 failing"):
        assert label in table["text/plain"]
    assert "traceml-history" in table["text/html"]
