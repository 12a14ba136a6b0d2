"""The overhead benchmark runs end to end in quick mode and reports every figure it promises.

No timing is asserted: quick mode's numbers are noise. The test checks that the script runs,
prints its table and writes its JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_benchmark_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/overhead.py", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    for loop in ("bare loop", "tiny MLP", "small conv net"):
        assert f"{loop}: " in text
    for variant in ("tracer", "monitor", "profiler"):
        assert f"  {variant} " in text
    assert "profiler-added / monitor-added" in text
    assert "median step" in text
    assert "hot path, interleaved" in text and "added per step = hot path (" in text
    assert "the wrapper's own time in next()" in text
    assert "processing the log into rows" in text
    assert "monitor over a" in text
    assert "bytes/step" in text
    assert "import traceml_nb" in text
    assert "view: " in text

    report = json.loads(out.read_text())
    assert set(report["loops"]) == {"bare loop", "tiny MLP", "small conv net"}
    for loop in report["loops"].values():
        assert set(loop["variants"]) == {"tracer", "monitor", "profiler"}
    assert "median_step_us" in report["loops"]["bare loop"]["variants"]["tracer"]
    for loop in report["loops"].values():
        assert {"step_us", "step_lo", "step_hi", "calls_us", "own_next_us"} <= set(
            loop["interleaved"]
        )
        assert loop["interleaved"]["monitor"] == "samplers and live view"
        assert set(loop["processing_us"]) == {"inline_no_view", "loop", "view_thread"}
        assert loop["processing_us"]["view_thread"] >= 0 and "estimate" in loop["added_us"]
    memory = report["memory"]
    # a loader row a step; an optimizer row only before the loader's first step closed
    assert memory["steps"] <= memory["rows"] <= memory["steps"] + 1
    assert memory["bytes_per_step"] > 0
    assert "torch" not in report["import"]["heavy_loaded"]
    for cold in report["cold_hot_path"]:  # ours beside the reference floor
        assert {"added", "added_lo", "added_hi", "floor_added", "floor_lo", "floor_hi"} <= set(cold)


def test_tracer_breakdown_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/overhead.py", "--breakdown", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "+ the fetch logged (full tracer)" in proc.stdout
    assert "hot path alone, caches evicted" in proc.stdout and "after writing 64 MB" in proc.stdout
    assert "the issue's reference floor" in proc.stdout and " floor); " in proc.stdout
