"""The demo: run the quickstart notebook headlessly in a real kernel and show what it found.

    python -m traceml_nb.demo [--notebook PATH] [--out DIR]

Executes ``notebooks/01_quickstart.ipynb`` with nbclient in the ``python3`` kernel, prints the
text version of every ``%%traceml`` report (diagnosis, advice, comparison) and of the history,
and writes ``DIR/report.html`` (the reports as they appear in the notebook) and the executed
notebook ``DIR/01_quickstart.ipynb``, which JupyterLab opens with its outputs.
"""

from __future__ import annotations

import argparse
import html
import sys
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


def run_demo(notebook: Path, out_dir: Path, timeout_s: int = 600) -> int:
    """Execute ``notebook``, print the reports, write the HTML report; return an exit code."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    if not notebook.is_file():
        print(f"error: notebook not found: {notebook}", file=sys.stderr)
        return 2
    nb = nbformat.read(notebook, as_version=4)
    print(f"Executing {notebook.name} in a real kernel (this takes about a minute on a CPU)...")
    t0 = time.perf_counter()
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=timeout_s,
        resources={"metadata": {"path": str(notebook.parent)}},
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        print(f"error: a cell of {notebook.name} failed:\n{exc}", file=sys.stderr)
        return 1
    print(f"Done in {time.perf_counter() - t0:.0f} s.\n")

    outputs = _outputs(nb)
    if not any("traceml-report" in data.get("text/html", "") for _, data in outputs):
        print(
            "error: the notebook ran but no traceml report was found in its outputs",
            file=sys.stderr,
        )
        return 1
    for number, data in outputs:
        print(f"--- cell {number} " + "-" * 60)
        print(data.get("text/plain", "").strip(), end="\n\n")

    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "report.html"
    report.write_text(
        _page(f"traceml_nb demo: {notebook.stem}", [d["text/html"] for _, d in outputs])
    )
    executed = out_dir / notebook.name
    nbformat.write(nb, executed)
    print(f"HTML report: {report}")
    print(f"Executed notebook: {executed}  (open it with: .venv/bin/jupyter lab {executed})")
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
