"""The run store at scale: 10,000 stored runs, and the write of a 1,000,000-step run.

    .venv/bin/python scripts/store_scale.py [--runs 10000] [--repeat 20]

Prints the median and the worst of ``--repeat`` timings of each operation (ms), the bytes per
stored run, and the store write of a run of 1,000,000 steps (its steps downsampled to
``MAX_STORED_STEPS`` as every run's are). Figures in benchmarks/README.md, "The run store at
scale".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from store_helpers import ENV, make_run  # noqa: E402

from traceml_nb.analysis.thresholds import MAX_STORED_STEPS  # noqa: E402
from traceml_nb.session.environment import capture_environment, hardware_class  # noqa: E402
from traceml_nb.session.history import downsample  # noqa: E402
from traceml_nb.session.store import Store  # noqa: E402
from traceml_nb.views.history_table import StoredHistory  # noqa: E402


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="traceml-scale-")
    store = Store(os.path.join(folder, "runs.sqlite"))
    names = [f"experiment-{i}" for i in range(50)]
    template = make_run(steps=MAX_STORED_STEPS + 200, source="x = 1\n" * 30)
    batch = []
    started = time.perf_counter()
    for i in range(args.runs):
        entry = make_run(steps=60, seed=i) if i < 50 else template
        entry.name = names[i % len(names)]
        entry.step_ms = template.step_ms
        entry.started_at = time.time() - (args.runs - i) * 60
        batch.append(entry)
        if len(batch) == 500:
            store.add_many(batch)
            batch = []
    if batch:
        store.add_many(batch)
    fill_s = time.perf_counter() - started
    import sqlite3

    conn = sqlite3.connect(store.path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    size = os.path.getsize(store.path)
    print(
        f"{store.count():,} runs stored in {fill_s:.1f} s; {size / 1e6:.1f} MB, "
        f"{size / store.count() / 1000:.1f} KB per run ({MAX_STORED_STEPS} steps each)"
    )
    hw = hardware_class(ENV)
    for label, fn in [
        ("history --all (query + text)", lambda: StoredHistory.of(store).text),
        ("history --all (query + HTML)", lambda: StoredHistory.of(store)._repr_html_()),
        ("history --name (query + text)", lambda: StoredHistory.of(store, name=names[3]).text),
        ("baseline lookup (5 runs, decoded)", lambda: store.baseline(names[7], hardware=hw)),
        ("latest run of a name", lambda: store.latest(names[9])),
    ]:
        med, worst = timed(fn, args.repeat)
        print(f"{label:<36} median {med:7.2f} ms   worst {worst:7.2f} ms")
    big = make_run(steps=200)
    big.step_ms = downsample([10.0 + (i % 7) * 0.01 for i in range(1_000_000)])
    fresh = Store(os.path.join(folder, "fresh.sqlite"))
    fresh.add(big)  # the schema
    med, worst = timed(lambda: fresh.add(big), args.repeat)
    print(f"{'store write, 1,000,000-step run':<36} median {med:7.2f} ms   worst {worst:7.2f} ms")
    med, worst = timed(lambda: store.add(big), args.repeat)
    print(f"{'... into the 10,000-run store':<36} median {med:7.2f} ms   worst {worst:7.2f} ms")

    class CpuRun:
        device_kind = "cpu"
        record = None

    med, worst = timed(lambda: capture_environment(CpuRun()), args.repeat)
    print(
        f"{'environment capture (git included)':<36} median {med:7.2f} ms   worst {worst:7.2f} ms"
    )


if __name__ == "__main__":
    main()
