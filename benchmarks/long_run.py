"""A long run: 1,000,000 fast synthetic steps through the real monitor, on the CPU.

    .venv/bin/python benchmarks/long_run.py [--steps N] [--optimizer]

Reports what a long run costs: the record's memory per step and in total, the process's RSS
growth, the live view's points held (headless writer running the whole time), how long the
end-of-run analysis (``Run.result()``) and the report take, and the most memory an analysis
of the whole record allocates at once (``tracemalloc``'s peak over one more ``analyze`` of a
snapshot, beside the snapshot's own). ``--optimizer``: an optimizer steps in every step, as
in training, where the phases are timed on sampled steps (without one, a loop's phases are
timed on every step). Figures, not assertions: the test suite never asserts on time.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import tracemalloc

import psutil
import torch
from torch.utils.data import DataLoader

import traceml_nb
from traceml_nb.views.live.view import LiveView

# a benchmark's runs are not the user's: kept out of the run store unless one is chosen
os.environ.setdefault("TRACEML_NB_STORE", "off")
from traceml_nb.views.report import Report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--optimizer", action="store_true", help="an optimizer step a step")
    args = parser.parse_args()
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)

    # batch_size=None: each step fetches one item with no collation, so a step is ~10 µs and
    # the run measures the monitor, not the loader
    loader = DataLoader(range(args.steps), batch_size=None)
    me = psutil.Process()
    gc.collect()
    rss0 = me.memory_info().rss
    t0 = time.perf_counter()
    with traceml_nb.Run("long run") as run:
        view = LiveView(run, display=False)
        view.start()
        total = 0
        for i in loader:
            total += i
            if args.optimizer:
                optimizer.step()
        view.stop()
    elapsed = time.perf_counter() - t0
    rss1 = me.memory_info().rss

    t1 = time.perf_counter()
    result = run.result()
    report = Report.of(result)
    html = report._repr_html_()
    text = repr(report)
    report_s = time.perf_counter() - t1
    snapshot_mib, analysis_mib = _analysis_memory(run)

    steps = len(run.record.steps)
    points = None
    if view.charts is not None:  # points the browser would hold, per chart source
        sources = [view.charts.steps, view.charts.host, *view.charts.gpus.values()]
        points = max(len(next(iter(src.data.values()), [])) for src in sources if src is not None)
    print(f"torch {torch.__version__}, {psutil.cpu_count()} CPUs")
    print(
        f"steps recorded            {steps:,} in {elapsed:.1f} s ({elapsed / steps * 1e6:.1f} µs a step)"
    )
    print(
        f"record memory             {run.record.nbytes / 2**20:.1f} MiB ({run.record.nbytes / steps:.1f} bytes a step)"
    )
    print(f"process RSS growth        {(rss1 - rss0) / 2**20:.1f} MiB")
    print(f"host samples kept         {len(run.record.host) if run.record.host else 0:,}")
    if points is not None:
        print(f"live view points held     {points:,} (largest chart source)")
    print(f"live view updates         {view.updates} ({view.messages} comm messages)")
    print(
        f"analysis + report         {report_s:.2f} s ({len(html) / 1024:.0f} KiB HTML, {len(text) / 1024:.1f} KiB text)"
    )
    print(
        f"analysis memory           {analysis_mib:.0f} MiB at its peak, over a snapshot of "
        f"{snapshot_mib:.0f} MiB"
    )
    print(f"verdict                   {result.diagnosis.verdict}")


def _analysis_memory(run: traceml_nb.Run) -> tuple[float, float]:
    """MiB a snapshot of the whole record holds, and the most an ``analyze`` of it allocates
    at once beyond that (what the live view's running verdict allocates on its thread)."""
    from traceml_nb.analysis import analyze

    gc.collect()
    tracemalloc.start()
    try:
        snapshot = run.snapshot()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        analyze(snapshot, run.capabilities)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return held / 2**20, (peak - held) / 2**20


if __name__ == "__main__":
    main()
