"""The demo: run the quickstart notebook headlessly in a real kernel and show what it found.

    python -m traceml_nb.demo [--notebook PATH] [--out DIR]

Executes ``notebooks/01_quickstart.ipynb`` with nbclient in the ``python3`` kernel, prints the
text version of every ``%%traceml`` report (diagnosis, advice, comparison) and of the history,
and writes ``DIR/report.html`` (the reports as they appear in the notebook) and the executed
notebook ``DIR/01_quickstart.ipynb``, which JupyterLab opens with its outputs. While it runs
it says which cell runs and for how long (:class:`Progress`); at the end, the command that
opens the notebook in this environment's JupyterLab (installed by the ``demo`` extra).
"""

from __future__ import annotations

import argparse
import html
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_NOTEBOOK = REPO / "notebooks" / "01_quickstart.ipynb"


def _outputs(nb: Any) -> list[tuple[int, dict[str, Any]]]:
    """(cell number, output data) of every display output of ours, in notebook order."""
    found = []
    for number, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            page = data.get("text/html", "")
            if "traceml-report" in page or "traceml-history" in page or "traceml-compare" in page:
                found.append((number, data))
    return found


def _page(title: str, parts: list[str]) -> str:
    body = "\n<hr>\n".join(parts)
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head>\n"
        "<body style='font-family: sans-serif; max-width: 1000px; margin: 2em auto'>\n"
        f"<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n"
    )


#: seconds between two "still running" lines while one cell runs
HEARTBEAT_S = 10.0


class Progress:
    """Says what the demo is doing as it goes: each cell as it starts (its number and first
    line, the time so far), how long it took, and a line every :data:`HEARTBEAT_S` while a
    long cell runs."""

    def __init__(self, nb: Any, out: Any = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.out = out if out is not None else sys.stdout
        self.heartbeat_s = heartbeat_s
        self.t0 = time.perf_counter()
        self.code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        self._cell: tuple[int, str, float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:5.0f} s] {text}", file=self.out, flush=True)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="demo-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def cell_started(self, cell: Any, cell_index: int, **_: Any) -> None:
        if cell.cell_type != "code":
            return
        number = self.code_cells.index(cell_index) + 1
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
        what = f"cell {number}/{len(self.code_cells)}: {first[:60]}"
        with self._lock:
            self._cell = (number, what, time.perf_counter())
        self.say(f"running {what}")

    def cell_done(self, cell: Any, cell_index: int, **_: Any) -> None:
        with self._lock:
            current, self._cell = self._cell, None
        if current is not None:
            self.say(f"  done in {time.perf_counter() - current[2]:.1f} s")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                current = self._cell
            if current is not None:
                self.say(
                    f"  still running cell {current[0]}, {time.perf_counter() - current[2]:.0f} s in"
                )


def open_command(executed: Path) -> str:
    """The command that opens ``executed`` in JupyterLab from the current directory: this
    Python's ``jupyter`` (relative when it is under the current directory), with
    ``--allow-root`` where the user is root (JupyterLab refuses to start otherwise)."""
    jupyter = Path(sys.executable).with_name("jupyter")
    try:
        shown = str(jupyter.relative_to(Path.cwd()))
    except ValueError:
        shown = str(jupyter)
    root = " --allow-root" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
    return f"{shlex.quote(shown)} lab{root} {shlex.quote(str(executed))}"


def jupyterlab_missing() -> str | None:
    """What to run first when JupyterLab is not installed in this environment (else None)."""
    import importlib.util

    if importlib.util.find_spec("jupyterlab") is not None:
        return None
    pip = Path(sys.executable).with_name("pip")
    return f"{pip} install jupyterlab   # JupyterLab is not installed in this environment"


def run_demo(notebook: Path, out_dir: Path, timeout_s: int = 600) -> int:
    """Execute ``notebook``, print the reports, write the HTML report; return an exit code."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    if not notebook.is_file():
        print(f"error: notebook not found: {notebook}", file=sys.stderr)
        return 2
    nb = nbformat.read(notebook, as_version=4)
    progress = Progress(nb)
    print(
        f"Executing {notebook.name} in a real kernel ({len(progress.code_cells)} code cells, "
        "about a minute on a CPU):",
        flush=True,
    )
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=timeout_s,
        resources={"metadata": {"path": str(notebook.parent)}},
        on_cell_execute=progress.cell_started,
        on_cell_executed=progress.cell_done,
    )
    progress.say("starting the kernel")
    progress.start()
    try:
        client.execute()
    except CellExecutionError as exc:
        print(f"error: a cell of {notebook.name} failed:\n{exc}", file=sys.stderr)
        return 1
    finally:
        progress.stop()
    print(f"Done in {time.perf_counter() - progress.t0:.0f} s.\n")

    outputs = _outputs(nb)
    if not any("traceml-report" in data.get("text/html", "") for _, data in outputs):
        print(
            "error: the notebook ran but no traceml report was found in its outputs",
            file=sys.stderr,
        )
        return 1
    for number, data in outputs:
        code_number = progress.code_cells.index(number) + 1  # as the progress lines count
        print(f"--- cell {code_number} " + "-" * 60)
        print(data.get("text/plain", "").strip(), end="\n\n")

    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "report.html"
    report.write_text(
        _page(f"traceml_nb demo: {notebook.stem}", [d["text/html"] for _, d in outputs])
    )
    executed = out_dir / notebook.name
    nbformat.write(nb, executed)
    print(f"HTML report: {report}")
    print(f"Executed notebook: {executed}")
    missing = jupyterlab_missing()
    if missing:
        print(f"To watch the live charts, first: {missing}")
    print(f"To watch the live charts, open it in JupyterLab: {open_command(executed)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m traceml_nb.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--notebook", type=Path, default=DEFAULT_NOTEBOOK, help="notebook to run")
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for report.html")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    return run_demo(args.notebook, args.out, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
