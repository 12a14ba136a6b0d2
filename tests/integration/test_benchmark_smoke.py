"""The overhead benchmark runs end to end in quick mode and reports every figure it promises.

No timing is asserted, nor how long a run takes: quick mode's numbers are noise, and a busy
machine may run it slowly. The tests check that the script runs, prints every line of its table
and every verdict, and writes the same into its JSON. A hang is caught by the test's timeout,
not by the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOPS = ("bare loop", "tiny MLP", "small conv net")
EVICTIONS = ("after writing 24 MB", "after writing 64 MB", "after conv step")
#: One verdict a budget (``benchmarks/report.py``), by its key in the JSON.
VERDICT_KEYS = {
    "added_us:bare loop",
    "added_us:tiny MLP",
    "over_keeping_floor_us:small conv net",
    *(f"profiler_ratio:{loop}" for loop in LOOPS),
    "sampler_idle_pct",
    "sampler_steady_pct",
    "view_pct",
    "view_added_pct",
    "bytes_per_step",
    "import_s",
}
VERDICTS = {"ok", "unresolved", "OVER", "n/a"}
#: A generous guard against a hang: quick mode takes well under a minute on a busy 2-core VM.
HANG_GUARD_S = 900


def _benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "benchmarks/overhead.py", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "issue" not in proc.stdout.lower()  # the output speaks in the repository's terms
    return proc


def _check_cold_hot_path(text: str, cold: list[dict]) -> None:
    assert "hot path alone, caches evicted" in text and "the bare-wrapper floor" in text
    for eviction in EVICTIONS:
        assert f"  {eviction}: next() " in text
    assert " floor); " in text and "traced over the floor" in text
    assert "over the keeping floor" in text
    assert [c["eviction"] for c in cold] == ["24 MB", "64 MB", "conv step"]
    for c in cold:  # ours beside the bare-wrapper floor, and the difference the budget reads
        assert {"added", "added_lo", "added_hi", "floor_added", "floor_lo", "floor_hi"} <= set(c)
        assert {"over_floor", "over_floor_lo", "over_floor_hi", "samples"} <= set(c)
        assert {"keeping_added", "over_keeping", "over_keeping_lo", "over_keeping_hi"} <= set(c)


@pytest.mark.timeout(HANG_GUARD_S)
def test_quick_benchmark_prints_the_table_and_the_verdicts_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    text = _benchmark("--quick", "--json", str(out)).stdout
    report = json.loads(out.read_text())

    for loop in LOOPS:
        assert f"{loop}: " in text
    for variant in ("tracer", "monitor", "profiler"):
        assert f"  {variant} " in text
    for line in (
        "profiler-added / monitor-added",
        "median step",
        "hot path, interleaved",
        "running alongside: samplers and live view",
        "inside next() and optimizer.step()",
        "our own time in next()",
        "processing the log into rows",
        "added per step = hot path (",
        "torch.profiler, interleaved",
        "profiler-added / added per step",
        "sampler thread during the monitor runs",
        "live view (LiveView.busy_s",
        "sampler at 10 Hz, idle run",
        "monitor over a",
        "bytes/step",
        "import traceml_nb",
        "view: ",
        "budgets:",
    ):
        assert line in text, line

    assert set(report["loops"]) == set(LOOPS)
    for loop in report["loops"].values():
        assert set(loop["variants"]) == {"tracer", "monitor", "profiler"}
        assert {"median_us", "min_us", "max_us", "median_step_us", "start_stop_ms"} <= set(
            loop["variants"]["tracer"]
        )
        assert {"step_us", "step_lo", "step_hi", "calls_us", "own_next_us"} <= set(
            loop["interleaved"]
        )
        assert loop["interleaved"]["monitor"] == "samplers and live view"
        assert set(loop["processing_us"]) == {"inline_no_view", "loop", "view_thread"}
        assert {"estimate", "lo", "hi", "hot_path"} <= set(loop["added_us"])
        assert {"pairs", "us", "lo", "hi"} <= set(loop["profiler_interleaved"])
        assert "profiler_over_added" in loop and "profiler_over_monitor" in loop
        assert "sampler_core_pct" in loop and "view_pct" in loop
    _check_cold_hot_path(text, report["cold_hot_path"])
    assert report["sampler_idle"]["available"] and "core_pct" in report["sampler_idle"]
    assert {"sampler_core_pct", "view_pct", "view_ticks"} <= set(report["monitor_steady"])
    memory = report["memory"]
    # a loader row a step; optimizer rows only until the loader is known to fetch in step
    # with the optimizer (three of its steps tell)
    assert memory["steps"] <= memory["rows"] <= memory["steps"] + 3
    assert memory["bytes_per_step"] > 0
    assert "torch" not in report["import"]["heavy_loaded"]

    verdicts = {v["key"]: v for v in report["verdicts"]}
    assert set(verdicts) == VERDICT_KEYS
    for v in verdicts.values():  # each printed as its line, whatever the figure
        assert v["verdict"] in VERDICTS
        line = f"  budget {v['what']}: {v['measured']} (budget {v['budget']}: {v['verdict']})"
        assert line in text, line


@pytest.mark.timeout(HANG_GUARD_S)
def test_tracer_breakdown_runs(tmp_path: Path) -> None:
    out = tmp_path / "breakdown.json"
    text = _benchmark("--breakdown", "4", "--quick", "--json", str(out)).stdout
    report = json.loads(out.read_text())
    for part in (
        "wrapper plumbing (calls through)",
        "+ two clock reads",
        "+ the fetch logged (full tracer)",
    ):
        assert f"  {part} " in text
        for loop in ("bare loop", "tiny MLP"):
            assert {"step_us", "step_lo", "step_hi", "calls_us"} <= set(report[loop][part])
    _check_cold_hot_path(text, report["cold_hot_path"])


@pytest.mark.timeout(HANG_GUARD_S)
def test_the_interleaved_blocks_start_after_the_runs_first_phase_samples() -> None:
    """The traced start before the blocks lasts until the run took its first samples (three
    here, for speed), and the fetches it made still line up with the run's step rows: our own
    time in ``next()`` is measured (it is NaN when they do not)."""
    snippet = (
        "import json, methods, workloads\n"
        "methods.EARLY_SAMPLES = 3\n"
        "work = workloads.bare_loop(30)\n"
        "r = methods.interleaved_cost(work, 3, 3, monitor=False, resamples=10)\n"
        "q = methods.interleaved_cost(work, 3, 3, monitor=False, resamples=10, settle=False)\n"
        "print(json.dumps([r.settle_steps, r.settle_samples, r.own_next_us,"
        " q.settle_steps, q.settle_samples, q.own_next_us]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", snippet],
        capture_output=True,
        text=True,
        cwd=ROOT / "benchmarks",
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps, samples, own, unsettled_steps, unsettled_samples, unsettled_own = json.loads(
        proc.stdout.splitlines()[-1]
    )
    assert steps > 0 and samples == 3 and own > 0
    assert unsettled_steps == unsettled_samples == 0 and unsettled_own > 0


@pytest.mark.timeout(HANG_GUARD_S)
def test_gate_power_quick_check_parts_run_and_leave_nothing_behind(tmp_path: Path) -> None:
    """``benchmarks/gate_power.py --quick`` on its check parts (the A/B parts take minutes even
    when quick), each decision two jobs judged by ``check --runs 2``: real jobs, a baseline
    store, judged copies, a busy core; the table and the raw results; its temporary directory
    and its busy process gone at the end."""
    out, scratch = tmp_path / "gates.json", tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.run(
        [sys.executable, "benchmarks/gate_power.py", "--quick", "--parts", "check,busy-check"]
        + ["--check-runs", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(scratch)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text, report = proc.stdout, json.loads(out.read_text())
    assert "| gate | machine | change | decisions | slower (exit 1) |" in text
    for machine, case in (("quiet", "identical"), ("quiet", "+10%"), ("quiet", "+20%")) + (
        ("one core busy", "identical"),
    ):
        assert f"| `check --runs 2` | {machine} | {case} | 1 |" in text, (machine, case)
    cases = [(d["gate"], d["load"], d["case"]) for d in report["decisions"]]
    assert cases == [
        ("check --runs 2", "quiet", "identical"),
        ("check --runs 2", "quiet", "+10%"),
        ("check --runs 2", "quiet", "+20%"),
        ("check --runs 2", "busy", "identical"),
    ]
    assert all(d["exit"] in (0, 1, 3) for d in report["decisions"]), report["decisions"]
    cal = report["calibration"]
    assert 0 == cal["extra"]["identical"] < cal["extra"]["+10%"] < cal["extra"]["+20%"]
    assert list(scratch.iterdir()) == []  # its temporary directory, the gates' files with it
    with pytest.raises(ProcessLookupError):
        os.kill(report["busy_pid"], 0)
