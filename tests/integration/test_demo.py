"""The demo (``python -m traceml_nb.demo``): it says what it does as it goes, and the
``jupyter lab`` command it prints at the end starts JupyterLab."""

from __future__ import annotations

import io
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from lab_server import status, stop, wait_for_status
from notebook_checks import assert_keeps_its_reports

from traceml_nb import demo

REPO = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT_S = 120  # a busy 2-core machine: JupyterLab usually answers in ~5 s


def tiny_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# tiny"),
        nbformat.v4.new_code_cell("%load_ext traceml_nb"),
        nbformat.v4.new_code_cell(
            "%%traceml --view none --no-store --name tiny\n"
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
            "for (x,) in DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4):\n"
            "    pass\n"
        ),
    ]
    nbformat.write(nb, path)
    return path


def test_the_demo_prints_each_cell_as_it_goes_and_a_jupyter_lab_line(tmp_path, capsys):
    notebook = tiny_notebook(tmp_path / "tiny.ipynb")
    assert demo.run_demo(notebook, tmp_path / "out", timeout_s=300) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert (
        lines[0] == "Executing tiny.ipynb in a real kernel (2 code cells, about a minute on a CPU):"
    )
    assert any(ln.endswith("] starting the kernel") for ln in lines)
    started = [ln for ln in lines if "] running cell " in ln]
    assert [ln.split("] ", 1)[1] for ln in started] == [
        "running cell 1/2: %load_ext traceml_nb",
        "running cell 2/2: %%traceml --view none --no-store --name tiny",
    ]
    assert sum("  done in " in ln for ln in lines) == 2
    assert "traceml report: " in out
    last = lines[-1]
    assert last.startswith("To watch the live charts, open it in JupyterLab: ")
    assert last.endswith(
        f"lab{' --allow-root' if os.geteuid() == 0 else ''} {tmp_path / 'out' / 'tiny.ipynb'}"
    )


def test_a_long_cell_gets_a_still_running_line():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time; time.sleep(9)")])
    out = io.StringIO()
    progress = demo.Progress(nb, out=out, heartbeat_s=0.05)
    progress.start()
    try:
        progress.cell_started(nb.cells[0], 0)
        deadline = time.monotonic() + 30
        while "still running cell 1" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        progress.cell_done(nb.cells[0], 0)
    finally:
        progress.stop()
    assert "] running cell 1/1: import time; time.sleep(9)" in out.getvalue()
    assert "still running cell 1, " in out.getvalue()


@pytest.mark.slow
def test_the_printed_jupyter_lab_command_starts_jupyterlab(tmp_path, monkeypatch):
    """What a user does after the README's first command: run the line the demo printed (from
    the repository, as the README says), here with no browser and a port and token of ours."""
    assert demo.jupyterlab_missing() is None, "the demo extra installs JupyterLab"
    notebook = tiny_notebook(tmp_path / "executed.ipynb")
    monkeypatch.chdir(REPO)
    command = shlex.split(demo.open_command(notebook))
    if os.geteuid() == 0:
        assert "--allow-root" in command  # JupyterLab refuses to start as root without it
    assert (REPO / command[0]).exists() or Path(command[0]).exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "traceml-demo-test"
    env = dict(os.environ)
    for name in ("config", "data", "runtime"):
        (tmp_path / name).mkdir()
        env[f"JUPYTER_{name.upper()}_DIR"] = str(tmp_path / name)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    log = tmp_path / "lab.log"
    extra = [
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    with log.open("wb") as f:
        proc = subprocess.Popen(
            command + extra, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_status(url, token, proc, log, SERVER_START_TIMEOUT_S)
        # the server's root is the notebook's folder: it serves the notebook the line names
        assert status(url, token, "api/contents/executed.ipynb") == 200
    finally:
        stop(proc)


def test_without_jupyterlab_the_demo_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "jupyterlab" else real(name, *a),
    )
    hint = demo.jupyterlab_missing()
    assert hint is not None and hint.endswith(
        "pip install jupyterlab   # JupyterLab is not installed in this environment"
    )


def _cells(stdout: str) -> dict[str, str]:
    """The demo's printed output of each code cell, by its number."""
    parts = re.split(r"^--- cell (\d+) -+$", stdout, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _line(report: str, start: str) -> str:
    found = [line for line in report.splitlines() if line.startswith(start)]
    assert len(found) == 1, report
    return found[0]


#: The speed-up of the demo's DataLoader fix the three-runs test requires to read "faster":
#: ~1.5-2.5x on a quiet 2-core machine (-59% to -61% here); one run against one with nothing
#: but the default noise (8% at 10 ms) reads "faster" from about -45%. On a machine whose other
#: work takes the cores the fix's workers need, the measured effect shrinks (-17% seen in CI),
#: and "inconclusive" is then the honest answer (never "slower" or "no significant change").
DEMO_FIX_SHOWN = -0.50


@pytest.mark.slow
def test_the_demo_three_times_on_a_fresh_store_tells_the_same_story(tmp_path):
    """The quickstart's story holds the second and third time too: the fixed cell reads
    "faster" against the starved one every time (where the machine let the fix make the steps
    30% shorter), never "no significant change" nor "slower"; and each cell's runs agree with
    the earlier runs of its own configuration (never "slower" or "faster" against them)."""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("TRACEML_NB_STORE", None)
    for i in range(3):
        done = subprocess.run(
            [sys.executable, "-m", "traceml_nb.demo", "--out", str(tmp_path / f"out{i}")],
            capture_output=True,
            text=True,
            timeout=1200,
            cwd=str(REPO),
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        executed = nbformat.read(tmp_path / f"out{i}" / "01_quickstart.ipynb", as_version=4)
        assert_keeps_its_reports(executed)  # (test_notebooks.py leaves the quickstart to this)
        assert any("Open In Colab" in c.source for c in executed.cells if c.cell_type == "markdown")
        cells = _cells(done.stdout)
        starved, fixed = cells["4"], cells["5"]
        previous = _line(fixed, "vs previous run #1 quickstart:")
        change = re.search(r"\(([+\u2212])(\d+)%, ", previous)
        assert change, previous
        pct = int(change.group(2)) * (-1 if change.group(1) == "\u2212" else 1) / 100
        assert ", slower" not in previous and "no significant change" not in previous, previous
        if pct <= DEMO_FIX_SHOWN:
            assert ", faster, beyond the run-to-run noise" in previous, f"demo {i + 1}:\n{fixed}"
        else:
            assert "inconclusive" in previous or ", faster" in previous, previous
        if i == 0:
            assert "vs baseline" not in starved
            continue
        for report in (starved, fixed):
            line = _line(report, "vs baseline:")
            runs = re.search(
                r"vs baseline: (\d+) runs? of this configuration of 'quickstart'", line
            )
            assert runs and 1 <= int(runs.group(1)) <= i, line
            assert ", slower" not in line and ", faster" not in line, f"demo {i + 1}:\n{report}"
