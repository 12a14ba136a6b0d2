"""The benchmark's table, its verdicts against the budgets, and its JSON.

Each ``*_section`` function turns one method's figures into lines of the table and the data of
the JSON report; :func:`verdicts` judges the report's data against the budgets, one verdict a
budget, and :func:`verdict_lines` prints them: ``ok`` (the whole 95% interval is within the
budget, or the figure is, where it has no interval), ``unresolved`` (the estimate is within
it, its interval is not), ``OVER``, or ``n/a`` (not measured).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
from typing import Any

import torch
from hot_path import ColdHotPath
from methods import VARIANTS, Interleaved, Timing
from workloads import Workload

from traceml_nb.selfcheck.paired_stats import Estimate, paired_added, paired_differences

#: The budgets (a 2-core CPU VM).
BUDGET_ADDED_US = 5.0  #: median added host time per step, bare loop and tiny MLP, us
#: hot path after a conv step, beyond the floor that keeps its clocks (``keeping_floor``), us
BUDGET_OVER_KEEPING_FLOOR_US = 2.0
BUDGET_PROFILER_RATIO = (
    50.0  #: torch.profiler must add at least this many times more (30 until 12-04)
)
BUDGET_SAMPLER_CORE_PCT = 1.0  #: sampler thread CPU, % of one core at 10 Hz
BUDGET_VIEW_PCT = 1.0  #: live view CPU, % of the run time at its default rate
BUDGET_BYTES_PER_STEP = 100.0
BUDGET_IMPORT_S = 0.3
#: Loops judged on the added time per step (the conv net is judged against the floor).
ADDED_BUDGET_LOOPS = ("bare loop", "tiny MLP")
#: The whole step's figure is the one added up when its 95% interval is at most this wide
#: (us); otherwise the figure inside ``next()`` and ``optimizer.step()`` (see ``Interleaved``).
PRECISE_INTERVAL_US = 2.0
#: The cold hot path's row the conv net's budget reads.
CONV_EVICTION = "conv step"


def machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": str(torch.get_num_threads()),
        "platform": platform.platform(),
    }


def _range(lo: float, hi: float, digits: int) -> str:
    return f"{lo:.{digits}f} .. {hi:.{digits}f}"


def _ratio_text(ratio: float | None) -> str:
    return "n/a (an added time at or below zero: noise)" if ratio is None else f"{ratio:.0f}x"


def _settle_text(inter: Interleaved) -> str:
    if not inter.settle_steps:
        return "from the run's start, its first phase samples (a one-off) in the blocks"
    return (
        f"after a traced start of {inter.settle_steps} steps, in which the run took its first "
        f"{inter.settle_samples} phase samples (a one-off)"
    )


def profiler_ratio(profiler_us: float, added_us: float) -> float | None:
    """How many times more the profiler adds than we do; None when either adds nothing
    measurable (zero or less, or NaN: the noise is larger than the cost)."""
    if not (added_us > 0 and profiler_us > 0):
        return None
    return profiler_us / added_us


def at_most(estimate: Estimate, budget: float) -> str:
    """The verdict on an estimate whose budget is an upper bound."""
    if math.isnan(estimate.median):
        return "n/a"
    if estimate.high <= budget:
        return "ok"
    return "unresolved" if estimate.median <= budget else "OVER"


# --- one loop: the repetitions, the interleaved blocks, the profiler's blocks ------------------
def loop_section(
    work: Workload,
    results: dict[str, list[Timing]],
    inter: Interleaved,
    prof: Estimate,
    profiler_pairs: int,
) -> tuple[list[str], dict[str, Any]]:
    """The table of one loop, and its figures for the JSON report.

    The repetitions give two estimates per variant, both over the repetition pairs: ``loop``,
    (variant loop - plain loop) / steps, holds every cost (sampler ticks included) and every
    burst of noise; ``median step`` compares the median single step of each loop, which
    ignores what happens on a minority of steps. The budget's figure is the interleaved
    blocks': the hot path plus the processing the loop's own thread did.
    """
    plain = [t.loop_ns for t in results["plain"]]
    plain_step = [t.median_step_ns for t in results["plain"]]
    step_us = statistics.median(plain) / work.steps / 1e3
    lo, hi = min(plain) / work.steps / 1e3, max(plain) / work.steps / 1e3
    lines = [
        f"{work.name}: {work.steps} steps x {len(plain)} repetitions, plain step {step_us:.1f} us "
        f"(min-max {_range(lo, hi, 1)}; median single step "
        f"{statistics.median(plain_step) / 1e3:.1f} us)",
        f"  {'':<9} {'-- (loop time - plain) / steps --':^59} {'-- median step --':^29}",
        f"  {'variant':<9} {'added us':>9} {'min .. max us':>20} {'added %':>9} {'min .. max %':>18}"
        f" {'added us':>9} {'min .. max us':>19} {'start+stop ms':>14}",
    ]
    data: dict[str, Any] = {
        "steps": work.steps,
        "reps": len(plain),
        "plain_step_us": step_us,
        "plain_median_step_us": statistics.median(plain_step) / 1e3,
        "variants": {},
    }
    for name in VARIANTS:
        if name == "plain":
            continue
        timings = results[name]
        a = paired_added(plain, [t.loop_ns for t in timings], work.steps)
        m = [d / 1e3 for d in paired_differences(plain_step, [t.median_step_ns for t in timings])]
        fixed_ms = statistics.median(t.setup_ns + t.teardown_ns for t in timings) / 1e6
        lines.append(
            f"  {name:<9} {a['median_us']:>9.2f} {_range(a['min_us'], a['max_us'], 2):>20}"
            f" {a['median_pct']:>8.3f}% {_range(a['min_pct'], a['max_pct'], 3):>18}"
            f" {statistics.median(m):>9.2f} {_range(min(m), max(m), 2):>19} {fixed_ms:>14.1f}"
        )
        data["variants"][name] = {
            **{k: v for k, v in a.items() if k.endswith(("_us", "_pct"))},
            "median_step_us": statistics.median(m),
            "median_step_min_us": min(m),
            "median_step_max_us": max(m),
            "start_stop_ms": fixed_ms,
        }
    v = data["variants"]
    ratio = profiler_ratio(v["profiler"]["median_us"], v["monitor"]["median_us"])
    ratio_step = profiler_ratio(v["profiler"]["median_step_us"], v["monitor"]["median_step_us"])
    data["profiler_over_monitor"] = ratio
    data["profiler_over_monitor_median_step"] = ratio_step
    lines.append(
        f"  profiler-added / monitor-added: {_ratio_text(ratio)} (loop time), "
        f"{_ratio_text(ratio_step)} (median step)"
    )

    pct = 100.0 * inter.step_us / inter.plain_step_us
    lines += [
        f"  hot path, interleaved ({inter.pairs} pairs of {inter.block_steps}-step blocks, "
        f"plain step {inter.plain_step_us:.1f} us; {_settle_text(inter)}; running alongside: "
        f"{inter.monitor}):",
        f"    whole step {inter.step_us:+.2f} us [{inter.step_lo:+.2f}, {inter.step_hi:+.2f}] "
        f"= {pct:+.3f}%; inside next() and optimizer.step() {inter.calls_us:+.2f} us "
        f"[{inter.calls_lo:+.2f}, {inter.calls_hi:+.2f}]; our own time in next() "
        f"{inter.own_next_us:.2f} us [{inter.own_next_lo:.2f}, {inter.own_next_hi:.2f}]",
    ]
    inline = [
        t.processing_ns / work.steps / 1e3 for t in results["tracer"] if t.processing_ns is not None
    ]
    inline_us = statistics.median(inline) if inline else math.nan
    lines.append(
        f"  processing the log into rows, per step: {inter.reader_processing_us:.2f} us on the "
        f"live view's thread and {inter.loop_processing_us:.2f} us on the loop's (interleaved "
        f"run); {inline_us:.2f} us on the loop's without a view (tracer repetitions, median)"
    )
    precise = inter.step_hi - inter.step_lo <= PRECISE_INTERVAL_US
    hot = (
        Estimate(inter.step_us, inter.step_lo, inter.step_hi)
        if precise
        else Estimate(inter.calls_us, inter.calls_lo, inter.calls_hi)
    )
    which = "whole step" if precise else "inside the calls: the whole step's is too wide"
    processing = inter.loop_processing_us
    added = Estimate(*(x + processing for x in hot))
    lines.append(
        f"  added per step = hot path ({which}) + the loop's processing: {added.median:+.2f} us "
        f"[{added.low:+.2f}, {added.high:+.2f}] = {100.0 * added.median / inter.plain_step_us:+.3f}%"
    )
    lines.append(
        f"  torch.profiler, interleaved ({profiler_pairs} pairs of {inter.block_steps}-step "
        f"blocks): whole step {prof.median:+.1f} us [{prof.low:+.1f}, {prof.high:+.1f}]; "
        f"profiler-added / added per step: {_ratio_text(profiler_ratio(prof.median, added.median))}"
    )
    data["interleaved"] = {**inter.__dict__, "step_pct": pct}
    data["processing_us"] = {
        "inline_no_view": inline_us,
        "loop": processing,
        "view_thread": inter.reader_processing_us,
    }
    data["added_us"] = {"estimate": added.median, "lo": added.low, "hi": added.high}
    data["added_us"]["hot_path"] = which
    data["profiler_interleaved"] = {
        "pairs": profiler_pairs,
        "us": prof.median,
        "lo": prof.low,
        "hi": prof.high,
    }
    data["profiler_over_added"] = profiler_ratio(prof.median, added.median)

    monitor = results["monitor"]
    sampler = [
        t.sampler_busy_ns / t.run_ns for t in monitor if t.sampler_busy_ns is not None and t.run_ns
    ]
    if sampler:
        data["sampler_core_pct"] = 100.0 * statistics.median(sampler)
        lines.append(
            f"  sampler thread during the monitor runs: {data['sampler_core_pct']:.2f}% of one "
            "core (median)"
        )
    views = [t.view_cpu_ns / t.run_ns for t in monitor if t.view_cpu_ns is not None and t.run_ns]
    if views:
        data["view_pct"] = 100.0 * statistics.median(views)
        lines.append(
            f"  live view (LiveView.busy_s, final update included) during the monitor runs: "
            f"{data['view_pct']:.2f}% of the run time (median)"
        )
    data["monitor_notes"] = sorted({n for t in monitor for n in t.notes})
    lines.extend(f"  note: {n}" for n in data["monitor_notes"])
    return lines, data


# --- the hot path alone, the other costs --------------------------------------------------------
def cold_section(costs: list[ColdHotPath]) -> tuple[list[str], list[dict[str, Any]]]:
    lines = [
        "hot path alone, caches evicted before each call (a stand-in loader and optimizer);",
        "  'floor': the bare-wrapper floor, a __next__ wrapper reading two clocks and an empty",
        "  global post-step hook; 'keeping': the floor that keeps its clocks (the wrapper appends",
        "  them, the hook appends the step's clock); all in the same rotating blocks:",
    ]
    for c in costs:
        after = c.eviction if c.eviction == CONV_EVICTION else f"writing {c.eviction}"
        lines.append(
            f"  after {after}: next() {c.fetch_plain:.2f} us plain, "
            f"{c.fetch_added:+.2f} traced ({c.floor_fetch_added:+.2f} floor); optimizer step's "
            f"end {c.step_plain:.2f} us plain, {c.step_added:+.2f} traced "
            f"({c.floor_step_added:+.2f} floor); added per step {c.added:+.2f} us "
            f"[{c.added_lo:+.2f}, {c.added_hi:+.2f}], floor {c.floor_added:+.2f} us "
            f"[{c.floor_lo:+.2f}, {c.floor_hi:+.2f}], keeping {c.keeping_added:+.2f} us "
            f"[{c.keeping_lo:+.2f}, {c.keeping_hi:+.2f}]; traced over the floor "
            f"{c.over_floor:+.2f} us [{c.over_floor_lo:+.2f}, {c.over_floor_hi:+.2f}], over "
            f"the keeping floor {c.over_keeping:+.2f} us [{c.over_keeping_lo:+.2f}, "
            f"{c.over_keeping_hi:+.2f}] ({c.samples} samples each)"
        )
    return lines, [c.__dict__ for c in costs]


def sampler_idle_line(idle: dict[str, Any]) -> str:
    if not idle["available"]:
        return f"sampler: not available ({idle['why']})"
    return (
        f"sampler at 10 Hz, idle run of {idle['seconds']:.1f} s: {idle['core_pct']:.2f}% of one "
        f"core ({idle['samples']} host samples)"
    )


def monitor_steady_line(steady: dict[str, Any]) -> str:
    text = f"monitor over a {steady['seconds']:.1f} s tiny-MLP run ({steady['steps']:,} steps): "
    if steady["sampler_core_pct"] is not None:
        text += f"samplers {steady['sampler_core_pct']:.2f}% of one core; "
    if "view_pct" not in steady:
        return text + f"live view {steady['view']}"
    text += (
        f"live view {steady['view_pct']:.2f}% of the run time, {steady['view_ticks']} ticks, "
        f"{steady['view_messages']} messages"
    )
    if "view_reading_pct" in steady:
        own = steady["view_pct"] - steady["view_reading_pct"] - steady["view_verdict_pct"]
        text += (
            f" (reading the rows {steady['view_reading_pct']:.2f}%: the engine's segmenting, "
            f"which the loop's thread does without a view; the running verdict "
            f"{steady['view_verdict_pct']:.2f}%; the view's own work {own:.2f}%)"
        )
    if "view_added_pct" in steady:
        text += (
            f"; without a view the loop's thread segments {steady['segmenting_us_without_view']:.2f}"
            f" us a step itself (the view's thread {steady['view_reading_us']:.2f}): what the view "
            f"adds to the run, {steady['view_added_pct']:.2f}%"
        )
    if steady.get("view_error"):
        text += f"; view error: {steady['view_error']}"
    return text


def memory_line(mem: dict[str, Any]) -> str:
    return (
        f"memory: {mem['steps']:,} steps (a loader batch and an optimizer step each) -> RunRecord "
        f"{mem['record_mb']:.1f} MB, {mem['bytes_per_step']:.1f} bytes/step; Python heap growth "
        f"{mem['heap_bytes_per_step']:.1f} bytes/step; tracer {mem['tracer_us_per_step']:.2f} "
        "us/step called directly"
    )


def import_line(imp: dict[str, Any]) -> str:
    heavy = ", ".join(imp["heavy_loaded"]) or "none"
    return (
        f"import traceml_nb (fresh interpreter, median of {imp['runs']}): "
        f"{imp['median_s'] * 1e3:.0f} ms; heavy packages imported: {heavy}"
    )


# --- the verdicts -------------------------------------------------------------------------------
def _verdict(key: str, what: str, measured: str, budget: str, verdict: str) -> dict[str, str]:
    return {"key": key, "what": what, "measured": measured, "budget": budget, "verdict": verdict}


def verdicts(report: dict[str, Any]) -> list[dict[str, str]]:
    """One verdict a budget, from the JSON report's data (only what was measured)."""
    out = []
    loops = report.get("loops", {})
    for name in ADDED_BUDGET_LOOPS:
        if name in loops:
            a = loops[name]["added_us"]
            est = Estimate(a["estimate"], a["lo"], a["hi"])
            out.append(
                _verdict(
                    f"added_us:{name}",
                    f"{name}: added per step, full monitor, interleaved blocks",
                    f"{est.median:+.2f} us [{est.low:+.2f}, {est.high:+.2f}]",
                    f"<= {BUDGET_ADDED_US:.0f} us",
                    at_most(est, BUDGET_ADDED_US),
                )
            )
    cold = [c for c in report.get("cold_hot_path", []) if c["eviction"] == CONV_EVICTION]
    if cold:
        c = cold[0]
        est = Estimate(c["over_keeping"], c["over_keeping_lo"], c["over_keeping_hi"])
        out.append(
            _verdict(
                "over_keeping_floor_us:small conv net",
                "small conv net: hot path after a conv step, beyond the floor that keeps its "
                "clocks, measured in the same blocks",
                f"{est.median:+.2f} us [{est.low:+.2f}, {est.high:+.2f}] (traced "
                f"{c['added']:+.2f}, keeping floor {c['keeping_added']:+.2f}, bare floor "
                f"{c['floor_added']:+.2f})",
                f"<= {BUDGET_OVER_KEEPING_FLOOR_US:.0f} us",
                at_most(est, BUDGET_OVER_KEEPING_FLOOR_US),
            )
        )
    for name, loop in loops.items():
        ratio = loop["profiler_over_added"]
        ok = ratio is not None and ratio >= BUDGET_PROFILER_RATIO
        out.append(
            _verdict(
                f"profiler_ratio:{name}",
                f"{name}: torch.profiler-added / added per step",
                _ratio_text(ratio),
                f">= {BUDGET_PROFILER_RATIO:.0f}x",
                "unresolved" if ratio is None else ("ok" if ok else "OVER"),
            )
        )
    pct = f"<= {BUDGET_SAMPLER_CORE_PCT:.0f}% of one core"
    idle = report.get("sampler_idle")
    if idle is not None:
        value = idle.get("core_pct", math.nan)
        out.append(
            _verdict(
                "sampler_idle_pct",
                "samplers at 10 Hz, idle run",
                f"{value:.2f}% of one core" if idle["available"] else "not available",
                pct,
                _upper(value, BUDGET_SAMPLER_CORE_PCT),
            )
        )
    steady = report.get("monitor_steady")
    if steady is not None:
        value = steady["sampler_core_pct"]
        value = math.nan if value is None else value
        out.append(
            _verdict(
                "sampler_steady_pct",
                "samplers at 10 Hz, training run",
                f"{value:.2f}% of one core",
                pct,
                _upper(value, BUDGET_SAMPLER_CORE_PCT),
            )
        )
        value = steady.get("view_pct", math.nan)
        out.append(
            _verdict(
                "view_pct",
                "live view at its default rate, training run",
                f"{value:.2f}% of the run time",
                f"<= {BUDGET_VIEW_PCT:.0f}% of the run time",
                _upper(value, BUDGET_VIEW_PCT),
            )
        )
        if "view_added_pct" in steady:  # the same budget, read as the view's cost to the run
            value = steady["view_added_pct"]
            out.append(
                _verdict(
                    "view_added_pct",
                    "live view, beyond the segmenting the loop does without it",
                    f"{value:.2f}% of the run time",
                    f"<= {BUDGET_VIEW_PCT:.0f}% of the run time",
                    _upper(value, BUDGET_VIEW_PCT),
                )
            )
    mem = report.get("memory")
    if mem is not None:
        out.append(
            _verdict(
                "bytes_per_step",
                f"memory, {mem['steps']:,} steps",
                f"{mem['bytes_per_step']:.1f} bytes/step",
                f"<= {BUDGET_BYTES_PER_STEP:.0f} bytes/step",
                _upper(mem["bytes_per_step"], BUDGET_BYTES_PER_STEP),
            )
        )
    imp = report.get("import")
    if imp is not None:
        heavy = ", ".join(imp["heavy_loaded"]) or "none"
        verdict = _upper(imp["median_s"], BUDGET_IMPORT_S)
        out.append(
            _verdict(
                "import_s",
                "import traceml_nb, fresh interpreter",
                f"{imp['median_s'] * 1e3:.0f} ms, heavy packages imported: {heavy}",
                f"<= {BUDGET_IMPORT_S * 1e3:.0f} ms, nothing heavy",
                "OVER" if imp["heavy_loaded"] else verdict,
            )
        )
    return out


def _upper(value: float, budget: float) -> str:
    """The verdict on a figure without an interval whose budget is an upper bound."""
    if math.isnan(value):
        return "n/a"
    return "ok" if value <= budget else "OVER"


def verdict_lines(judged: list[dict[str, str]]) -> list[str]:
    lines = ["budgets:"]
    for v in judged:
        lines.append(
            f"  budget {v['what']}: {v['measured']} (budget {v['budget']}: {v['verdict']})"
        )
    return lines


# --- the breakdown --------------------------------------------------------------------------------
def breakdown_lines(name: str, parts: dict[str, Interleaved]) -> list[str]:
    first = next(iter(parts.values()), None)
    lines = [f"{name} ({_settle_text(first)}):" if first is not None else f"{name}:"]
    for part, v in parts.items():
        lines.append(
            f"  {part:<34} whole step {v.step_us:+6.2f} [{v.step_lo:+.2f}, {v.step_hi:+.2f}]   "
            f"inside the calls {v.calls_us:+6.2f} [{v.calls_lo:+.2f}, {v.calls_hi:+.2f}]"
        )
    return lines
