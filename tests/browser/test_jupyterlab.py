"""The live chart in a real JupyterLab 4 in headless Chromium.

A notebook trains a small model on a real (deliberately slow) DataLoader under ``%%traceml``
(or, while the magic is absent, under ``traceml_nb.Run`` + ``LiveView``) until the test lets it
stop. While the cell's prompt still reads ``[*]:`` the test reads the chart twice, ~2 s apart,
and checks that both the header's step count and the rendered pixels changed; then it ends the
loop (by creating a file the loop looks for) and checks the final state is shown. The loop does
not train for a fixed time: under load the page and the live view can take most of such a
time to show up, and the cell would end before the test has read the running chart. A screenshot of the running chart is written to the test's
temporary directory, and to ``docs/screenshot.png`` when ``TRACEML_UPDATE_SCREENSHOT=1``.

Each test opens its notebook and waits, on the page's own ``window.jupyterapp``, until the
notebook's session has a kernel that is connected and idle (and the server lists that kernel
for the notebook's path) before it runs a cell; it runs cells by JupyterLab's commands on a
cell it makes active, and checks that the cell's prompt turned to ``[*]:``. The execution
indicator in the notebook's toolbar is no readiness signal: it reads ``idle`` from the moment
the notebook is opened, before the session even asked for a kernel, and a run command that
arrives while the kernel is still being started is dropped without a trace (the prompt stays
``[ ]:``).

Bokeh 3 renders inside open shadow roots: Playwright's CSS locators pierce them.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HERE = Path(__file__).parent
REPO = HERE.parent.parent
NOTEBOOKS = HERE / "notebooks"
SCREENSHOT = REPO / "docs" / "screenshot.png"
TRAIN_CELL = 2  #: index of the training cell (0: markdown, 1: setup)
GATE_CAP_S = 240  #: the longest a gated training loop runs if the test never ends it
KERNEL_READY_TIMEOUT_S = 90.0
#: a cell that was started: running or queued (``[*]:``), or already done (``[n]:``)
STARTED = re.compile(r"^\[(\*|\d+)\]:$")

#: The state of the notebook at ``path`` as the page's application sees it: its panel in the
#: main area (JupyterLab's or Notebook 7's shell), its content, its session and its kernel.
NOTEBOOK_STATE_JS = """
(path) => {
  const app = window.jupyterapp;
  if (!app) return {app: false};
  const panel = Array.from(app.shell.widgets('main')).find(
    (w) => w.context && w.context.path === path && w.sessionContext && w.content);
  if (!panel) return {app: true, panel: false};
  const session = panel.sessionContext;
  const kernel = session.session ? session.session.kernel : null;
  return {
    app: true,
    panel: true,
    current: app.shell.currentWidget === panel,
    contentReady: panel.context.isReady,
    cells: panel.content.widgets.length,
    sessionReady: session.isReady,
    pendingInput: session.pendingInput,
    kernelId: kernel ? kernel.id : null,
    connection: kernel ? kernel.connectionStatus : null,
    status: kernel ? kernel.status : null,
  };
}
"""

#: Make cell ``index`` the only selected, active cell of the notebook at ``path`` and start
#: ``command`` on it; false when the notebook is not the current widget (the notebook commands
#: act on the current one). The command's promise (resolved when the cells have run) is not
#: awaited.
RUN_COMMAND_JS = """
([path, command, index]) => {
  const app = window.jupyterapp;
  const panel = Array.from(app.shell.widgets('main')).find(
    (w) => w.context && w.context.path === path && w.sessionContext && w.content);
  if (!panel || app.shell.currentWidget !== panel || !app.commands.isEnabled(command)) {
    if (panel) app.shell.activateById(panel.id);
    return false;
  }
  const notebook = panel.content;
  notebook.mode = 'command';
  notebook.activeCellIndex = index;
  notebook.deselectAll();
  void app.commands.execute(command);
  return true;
}
"""


def magic_available() -> bool:
    """True when ``%%traceml`` exists (``traceml_nb/notebook/magic.py`` with ``register``)."""
    try:
        from traceml_nb.notebook import magic
    except ImportError:
        return False
    return callable(getattr(magic, "register", None))


def dismiss_news(page) -> None:
    """Close JupyterLab's "Jupyter news" / update toast if it shows up."""
    for name in ("No", "Dismiss", "Close"):
        buttons = page.locator(".jp-toast-button, .Toastify__close-button").filter(has_text=name)
        for i in range(buttons.count()):
            try:
                buttons.nth(i).click(timeout=1000)
            except Exception:
                pass
    close = page.locator(".Toastify__close-button")
    for i in range(close.count()):
        try:
            close.nth(i).click(timeout=1000)
        except Exception:
            pass


def prompt_of(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-InputPrompt")


def notebook_state(page, path: str) -> dict:
    return page.evaluate(NOTEBOOK_STATE_JS, path)


def _kernel_ready(state: dict) -> bool:
    return bool(
        state.get("contentReady")
        and state.get("sessionReady")
        and not state.get("pendingInput")
        and state.get("kernelId")
        and state.get("connection") == "connected"
        and state.get("status") == "idle"
    )


def wait_for_kernel_idle(page, lab_server, path: str) -> str:
    """Wait until the notebook at ``path`` is loaded and its session's kernel is connected and
    idle in the page, and the server lists that same kernel (started) for ``path``; return the
    kernel's id. Until then a run command would be dropped."""
    deadline = time.monotonic() + KERNEL_READY_TIMEOUT_S
    state: dict = {}
    server: list[dict] = []
    while time.monotonic() < deadline:
        state = notebook_state(page, path)
        if _kernel_ready(state):
            server = lab_server.sessions()
            if any(
                s["path"] == path
                and s["kernel"]["id"] == state["kernelId"]
                and s["kernel"]["execution_state"] in ("idle", "busy")
                for s in server
            ):
                return state["kernelId"]
        time.sleep(0.2)
    raise AssertionError(
        f"the kernel of {path} was not connected and idle after {KERNEL_READY_TIMEOUT_S:.0f} s:"
        f" page {state}, server {server}"
    )


def run_cell(page, path: str, index: int, command: str = "notebook:run-cell") -> None:
    """Run cell ``index`` of the notebook at ``path`` (or, with ``notebook:run-all-cells``, all
    of them) by a JupyterLab command, and check that the cell was started: its prompt reads
    ``[*]:`` (running or queued) or already ``[n]:``."""
    from playwright.sync_api import expect

    deadline = time.monotonic() + 10
    while not page.evaluate(RUN_COMMAND_JS, [path, command, index]):
        assert time.monotonic() < deadline, (
            f"{command} is not enabled on {path}: {notebook_state(page, path)}"
        )
        time.sleep(0.2)
    expect(prompt_of(page, index)).to_have_text(STARTED, timeout=30_000)


def open_notebook(page, lab_server, url: str, path: str) -> str:
    """Open the notebook at ``path`` (served at ``url``), ready to run cells: its kernel is
    connected and idle. Returns the kernel's id."""
    page.goto(url)
    # exposed by the server's expose_app_in_browser options (conftest.py)
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=90_000)
    kernel = wait_for_kernel_idle(page, lab_server, path)
    dismiss_news(page)
    return kernel


def report_failure(page, lab_server, path: str, tmp_path: Path) -> None:
    """On a failed test: a screenshot of the page (if it is still open), the notebook's state
    in the page and in the server, the end of the server's log."""
    if not page.is_closed():
        shot = tmp_path / "failure.png"
        try:
            page.screenshot(path=str(shot), full_page=True)
            print("screenshot of the failure:", shot)
            print("notebook state in the page:", notebook_state(page, path))
        except Exception as exc:
            print("no screenshot:", exc)
    try:
        print("server sessions:", lab_server.sessions())
    except Exception as exc:
        print("no server sessions:", exc)
    print("server log:\n", lab_server.log.read_text()[-4000:])


def steps_shown(page) -> int:
    text = page.locator(".traceml-steps").first.inner_text(timeout=5000)
    return int(re.sub(r"[^0-9]", "", text))


HEADER_STEPS = re.compile(r" · ([\d,]+) (steps?) · ")
COLLECTING = re.compile(r"collecting: ([\d,]+) (steps?) so far, a verdict after 10 steady steps")


def check_header_agrees(page) -> str:
    """Read the live header once (one string, so its parts are of the same update) and check
    that its verdict part agrees with its step count: "collecting" with the same count before
    there is a verdict, then "verdict so far"; never a verdict of no steps while it counts
    some, and "1 step", not "1 steps". Returns what the verdict part says."""
    text = page.locator(".traceml-live-header").first.inner_text(timeout=5000)
    counted = HEADER_STEPS.search(text)
    assert counted, text
    steps = int(counted.group(1).replace(",", ""))
    assert counted.group(2) == ("step" if steps == 1 else "steps"), text
    assert "No training steps" not in text, text
    collecting = COLLECTING.search(text)
    if collecting:
        assert int(collecting.group(1).replace(",", "")) == steps, text
        assert collecting.group(2) == ("step" if steps == 1 else "steps"), text
        return "collecting"
    assert "verdict so far: " in text and steps >= 10, text
    return "verdict so far"


def gated_notebook(name: str, stop: Path):
    """The notebook ``NOTEBOOKS/name`` with its training loop gated on the file ``stop``: the
    loop runs until the test creates that file (at most ``GATE_CAP_S``), not ``TRAIN_SECONDS``."""
    import nbformat

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    setup, train = nb.cells[1], nb.cells[TRAIN_CELL]
    assert "TRAIN_SECONDS = 15" in setup.source, setup.source
    assert "if time.monotonic() > deadline:" in train.source, train.source
    setup.source = setup.source.replace(
        "TRAIN_SECONDS = 15",
        f"TRAIN_SECONDS = {GATE_CAP_S}  # at most: the test ends the loop\n"
        f"import os\nSTOP = {str(stop)!r}",
    )
    train.source = train.source.replace(
        "if time.monotonic() > deadline:",
        "if time.monotonic() > deadline or os.path.exists(STOP):",
    )
    return nb


@pytest.fixture
def stop(tmp_path: Path) -> Iterator[Path]:
    """The file that ends the training loop of a :func:`gated_notebook`; created at the end of
    the test at the latest, so that a failed test leaves no loop training on."""
    path = tmp_path / "stop"
    yield path
    path.touch()


@pytest.fixture
def notebook(lab_server, stop) -> str:
    import nbformat

    name = "traceml_magic.ipynb" if magic_available() else "live_view_direct.ipynb"
    nbformat.write(gated_notebook(name, stop), lab_server.root / name)
    return name


def test_live_chart_updates_while_the_cell_runs(lab_server, page, notebook, stop, tmp_path):
    from playwright.sync_api import expect

    try:
        open_notebook(page, lab_server, lab_server.notebook_url(notebook), notebook)
        expect(page.locator(".jp-Notebook .jp-Cell").nth(TRAIN_CELL)).to_be_visible()
        run_cell(page, notebook, 1, "notebook:run-all-cells")
        running = prompt_of(page, TRAIN_CELL)
        expect(running).to_have_text("[*]:", timeout=60_000)
        header = page.locator(".traceml-steps").first
        expect(header).to_be_visible(timeout=60_000)  # BokehJS loaded, the widget rendered
        # wait for the first steps to arrive (the header agreeing with itself all along), then
        # read the chart twice, 2 s apart
        deadline = time.monotonic() + 30
        seen = [check_header_agrees(page)]
        while steps_shown(page) == 0 and time.monotonic() < deadline:
            time.sleep(0.25)
            seen.append(check_header_agrees(page))
        chart = page.locator(".jp-Notebook .jp-Cell").nth(TRAIN_CELL).locator(".jp-OutputArea")
        dismiss_news(page)
        steps_before = steps_shown(page)
        pixels_before = chart.screenshot()
        time.sleep(2.0)
        steps_after = steps_shown(page)
        pixels_after = chart.screenshot()
        still_running = running.inner_text()
        assert still_running == "[*]:", "the cell ended before the second reading"
        assert steps_after > steps_before > 0
        assert pixels_after != pixels_before
        # the header keeps agreeing with itself until there is a verdict, and keeps it
        deadline = time.monotonic() + 30
        while seen[-1] != "verdict so far" and time.monotonic() < deadline:
            time.sleep(0.25)
            seen.append(check_header_agrees(page))
        assert running.inner_text() == "[*]:" and seen[-1] == "verdict so far", seen
        assert "collecting" not in seen[seen.index("verdict so far") :], seen

        time.sleep(3.0)  # a few more seconds of chart for the picture
        dismiss_news(page)
        shot = tmp_path / "screenshot.png"
        chart.screenshot(path=str(shot))
        if os.environ.get("TRACEML_UPDATE_SCREENSHOT") == "1":
            SCREENSHOT.parent.mkdir(exist_ok=True)
            shutil.copy(shot, SCREENSHOT)

        # the cell ends: its prompt gets a number and the final state is visible
        stop.touch()
        expect(running).to_have_text(re.compile(r"\[\d+\]:"), timeout=90_000)
        output = page.locator(".jp-Notebook .jp-Cell").nth(TRAIN_CELL).locator(".jp-OutputArea")
        if notebook == "traceml_magic.ipynb":
            from traceml_nb.analysis import VERDICTS

            report = output.locator(".traceml-report").first
            expect(report).to_be_visible(timeout=30_000)
            text = report.inner_text().lower()
            assert any(verdict in text for verdict in VERDICTS), text
            expect(page.locator(".traceml-status").first).to_have_text("completed")
        else:
            expect(page.locator(".traceml-status").first).to_have_text("completed", timeout=30_000)
            expect(output.get_by_text(re.compile(r"view: \d+ ticks"))).to_be_visible()
        expect(output.get_by_text("Error displaying widget")).to_have_count(0)
        page.screenshot(path=str(tmp_path / "final.png"), full_page=True)
        errors = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        )
        assert errors.count() == 0 or "Error" not in errors.first.inner_text()
    except BaseException:
        report_failure(page, lab_server, notebook, tmp_path)
        raise


def test_closing_the_tab_mid_run_harms_nothing(lab_server, page, stop, tmp_path):
    """The user closes the browser tab while the cell runs: the kernel finishes the cell, the
    run completes with its report and lands in the history (saved by a queued later cell)."""
    import json

    import nbformat
    from playwright.sync_api import expect

    if not magic_available():
        pytest.skip("needs %%traceml")
    saved = tmp_path / "history.json"
    nb = gated_notebook("traceml_magic.ipynb", stop)
    nb.cells[2].source = nb.cells[2].source.replace("--name browser-test", "--name closed-tab")
    nb.cells.append(nbformat.v4.new_code_cell(f"%traceml save {saved}"))
    path = "closed_tab.ipynb"
    nbformat.write(nb, lab_server.root / path)

    try:
        open_notebook(page, lab_server, lab_server.notebook_url(path), path)
        run_cell(page, path, 1)  # the setup cell, alone
        expect(prompt_of(page, 1)).to_have_text(re.compile(r"\[\d+\]:"), timeout=90_000)
        started = time.monotonic()
        run_cell(page, path, TRAIN_CELL)  # the training cell...
        run_cell(page, path, TRAIN_CELL + 1)  # ...and the save cell, queued behind it
        expect(page.locator(".traceml-steps").first).to_be_visible(timeout=60_000)
        visible_after = time.monotonic() - started
        print(f"\nlive view visible {visible_after:.2f} s after the cell was started")
        expect(prompt_of(page, TRAIN_CELL)).to_have_text("[*]:")
    except BaseException:
        report_failure(page, lab_server, path, tmp_path)
        raise
    page.close()  # the tab goes away while the live view is still sending updates
    time.sleep(3.0)  # ...and it goes on sending them for a while
    stop.touch()

    deadline = time.monotonic() + 120
    while not saved.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert saved.exists(), "the queued cell after the training cell never ran"
    runs = json.loads(saved.read_text())["runs"]
    (run,) = [r for r in runs if r["name"] == "closed-tab"]
    assert run["status"] == "completed"
    assert run["summary"]["total_steps"] > 10
    assert run["diagnosis"]["verdict"] == "input-bound"


def test_notebook_7_shows_the_live_chart_and_the_report(lab_server, page, stop, tmp_path):
    """The same cell in Notebook 7's UI (served by the same server): the chart updates while
    the cell runs and the report with its verdict is shown at the end."""
    import nbformat
    from playwright.sync_api import expect

    if not magic_available():
        pytest.skip("needs %%traceml")
    nb = gated_notebook("traceml_magic.ipynb", stop)
    path = "notebook7.ipynb"
    nbformat.write(nb, lab_server.root / path)

    try:
        url = f"{lab_server.url}/notebooks/{path}?token={lab_server.token}"
        open_notebook(page, lab_server, url, path)
        expect(page.locator(".jp-Notebook .jp-Cell").nth(TRAIN_CELL)).to_be_visible()
        run_cell(page, path, 1, "notebook:run-all-cells")
        running = prompt_of(page, TRAIN_CELL)
        expect(running).to_have_text("[*]:", timeout=60_000)
        expect(page.locator(".traceml-steps").first).to_be_visible(timeout=60_000)
        deadline = time.monotonic() + 30
        while steps_shown(page) == 0 and time.monotonic() < deadline:
            time.sleep(0.25)
        before = steps_shown(page)
        time.sleep(2.0)
        assert running.inner_text() == "[*]:", "the cell ended before the second reading"
        assert steps_shown(page) > before > 0
        stop.touch()
        expect(running).to_have_text(re.compile(r"\[\d+\]:"), timeout=90_000)
        report = page.locator(".jp-Notebook .jp-Cell").nth(TRAIN_CELL).locator(".traceml-report")
        expect(report.first).to_be_visible(timeout=30_000)
        assert "input-bound" in report.first.inner_text().lower()
    except BaseException:
        report_failure(page, lab_server, path, tmp_path)
        raise


HANDLE_STEPS = re.compile(r" · ([\d,]+) steps?\b")


def handle_steps(page) -> int:
    """The step count the HTML (display-handle) view shows now."""
    text = page.locator(".traceml-live").first.inner_text(timeout=5000)
    counted = HANDLE_STEPS.search(text)
    assert counted, text
    return int(counted.group(1).replace(",", ""))


def test_the_html_view_vscode_and_pycharm_get_updates_while_the_cell_runs(
    lab_server, page, stop, tmp_path
):
    """The view VS Code's and PyCharm's kernels get by default: the kernel is made to read as
    VS Code's (``VSCODE_PID`` set in its environment by the setup cell), the training cell has
    no ``--view``, and its one HTML output, updated in place, shows more steps 2 s later while
    the cell runs; no Bokeh widget is created; at the end the final state and the report."""
    import nbformat
    from playwright.sync_api import expect

    if not magic_available():
        pytest.skip("needs %%traceml")
    nb = gated_notebook("traceml_magic.ipynb", stop)
    nb.cells[1].source += '\nos.environ["VSCODE_PID"] = "4242"  # the kernel reads as VS Code\'s'
    path = "html_view.ipynb"
    nbformat.write(nb, lab_server.root / path)
    try:
        open_notebook(page, lab_server, lab_server.notebook_url(path), path)
        expect(page.locator(".jp-Notebook .jp-Cell").nth(TRAIN_CELL)).to_be_visible()
        run_cell(page, path, 1, "notebook:run-all-cells")
        running = prompt_of(page, TRAIN_CELL)
        expect(running).to_have_text("[*]:", timeout=60_000)
        live = page.locator(".traceml-live").first
        expect(live).to_be_visible(timeout=60_000)
        deadline = time.monotonic() + 30
        while handle_steps(page) == 0 and time.monotonic() < deadline:
            time.sleep(0.25)
        before = handle_steps(page)
        time.sleep(2.5)  # the view updates at most once a second
        after = handle_steps(page)
        assert running.inner_text() == "[*]:", "the cell ended before the second reading"
        assert after > before > 0
        assert "running" in live.inner_text()
        cell = page.locator(".jp-Notebook .jp-Cell").nth(TRAIN_CELL)
        expect(cell.locator(".traceml-live svg").first).to_be_visible()
        expect(cell.locator(".traceml-steps")).to_have_count(0)  # no Bokeh widget
        expect(page.locator(".traceml-live")).to_have_count(1)  # one output, updated in place
        stop.touch()
        expect(running).to_have_text(re.compile(r"\[\d+\]:"), timeout=90_000)
        expect(live).to_contain_text("completed; the report follows", timeout=30_000)
        report = cell.locator(".traceml-report")
        expect(report.first).to_be_visible(timeout=30_000)
        expect(cell.get_by_text("Error displaying widget")).to_have_count(0)
    except BaseException:
        report_failure(page, lab_server, path, tmp_path)
        raise


#: Batches each rank trains on in the browser test: ~4 s of 22 ms batches on rank 1, long
#: enough to see the lines grow, short enough for a test.
BROWSER_RANK_BATCHES = 180


def test_ranks_launched_from_the_cell_get_a_line_each(lab_server, page, tmp_path):
    """``%%traceml`` on a cell that forks two gloo DDP ranks (``tests/support/rank_fns.py``: rank 1's
    dataset sleeps 20 ms more a batch): the ranks' lines are added to the shown charts as the
    ranks start (a document patch with new models, applied by BokehJS without an error), the
    header follows rank 1, the straggler, and the report has the ranks table."""
    import nbformat
    from playwright.sync_api import expect

    if not magic_available():
        pytest.skip("needs %%traceml")
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    nb = nbformat.v4.new_notebook()
    nb.metadata = nbformat.read(NOTEBOOKS / "traceml_magic.ipynb", as_version=4).metadata
    nb.cells = [
        nbformat.v4.new_markdown_cell("Two ranks launched from the notebook"),
        nbformat.v4.new_code_cell(
            "%load_ext traceml_nb\n"
            "import socket, sys\n"
            f"sys.path.insert(0, {str(REPO / 'tests' / 'support')!r})\n"
            "import rank_fns\n"
            "import torch.multiprocessing as mp\n"
            f"rank_fns.BATCHES = {BROWSER_RANK_BATCHES}\n"
            "with socket.socket() as s:\n"
            "    s.bind(('127.0.0.1', 0))\n"
            "    PORT = s.getsockname()[1]\n"
        ),
        nbformat.v4.new_code_cell(
            "%%traceml --name ranks-browser --no-store\n"
            f"mp.start_processes(rank_fns.train_rank, args=(2, PORT, {str(tmp_path)!r}), "
            "nprocs=2, start_method='fork')\n"
        ),
    ]
    path = "ranks.ipynb"
    nbformat.write(nb, lab_server.root / path)
    try:
        open_notebook(page, lab_server, lab_server.notebook_url(path), path)
        run_cell(page, path, 1, "notebook:run-all-cells")
        cell = page.locator(".jp-Notebook .jp-Cell").nth(TRAIN_CELL)
        rank = page.locator(".traceml-rank").first
        expect(rank).to_have_text("rank 1 (slowest of 2)", timeout=120_000)
        dismiss_news(page)
        cell.locator(".jp-OutputArea").screenshot(path=str(tmp_path / "ranks-running.png"))
        expect(prompt_of(page, TRAIN_CELL)).to_have_text(re.compile(r"\[\d+\]:"), timeout=120_000)
        header = page.locator(".traceml-live-header").first.inner_text()
        assert f"{BROWSER_RANK_BATCHES} steps" in header, header
        assert header.endswith(": the straggler"), header
        expect(page.locator(".traceml-status").first).to_have_text("completed")
        report = cell.locator(".traceml-report").first
        expect(report).to_be_visible(timeout=30_000)
        assert "Ranks (2)" in report.inner_text()
        expect(cell.get_by_text("Error displaying widget")).to_have_count(0)
        cell.locator(".jp-OutputArea").screenshot(path=str(tmp_path / "ranks-final.png"))
        bokeh_errors = [e for e in errors if "bokeh" in e.lower() or "patch" in e.lower()]
        assert not bokeh_errors, bokeh_errors
    except BaseException:
        report_failure(page, lab_server, path, tmp_path)
        raise
