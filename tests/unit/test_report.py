"""The final report's renderers, on hand-built analyses: exact strings, honest gaps, valid HTML."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from types import SimpleNamespace
from typing import Any

import pytest
from builders import make_summary

from traceml_nb.analysis import compare
from traceml_nb.analysis.findings import Diagnosis, Evidence, Finding, Summary
from traceml_nb.analysis.input_bound import CAUSE_TOO_FEW_WORKERS
from traceml_nb.analysis.pipeline import Analysis
from traceml_nb.engine.capabilities import Capabilities
from traceml_nb.engine.run import NO_CUDA
from traceml_nb.views.chart import MAX_BARS, step_chart_svg
from traceml_nb.views.chart import bars_of as downsample
from traceml_nb.views.html import render_html
from traceml_nb.views.report import ComparisonView, HistoryTable, Report
from traceml_nb.views.report_content import LabelledComparison, RunMeta, StepChart
from traceml_nb.views.text import metric_lines, render_text

CPU_ONLY = NO_CUDA


def make_diagnosis(**changes) -> Diagnosis:
    values: dict[str, Any] = dict(
        verdict="input-bound",
        title=Finding("input-bound", {"input_kind": "host", "input_share": 0.44}),
        confidence="high",
        cause=CAUSE_TOO_FEW_WORKERS,
        evidence=[
            Evidence(
                "data wait", 0.44, Finding("input-share", {"share": 0.44, "per_step_ms": 139.0})
            )
        ],
        advice=[
            Finding(
                "change-loader",
                {
                    "changes": [
                        {"setting": "num_workers", "new": 4, "old": 0},
                        {"setting": "pin_memory", "new": True, "old": None},
                    ],
                    "driver": None,
                },
            )
        ],
        wont_help=[Finding("faster-cpu-not-cpu-bound")],
        saving_bound_share=0.44,
        saving=Finding(
            "input-saving", {"input_kind": "host", "share": 0.44, "wait_s": 27.8, "elapsed_s": 63.2}
        ),
    )
    values.update(changes)
    return Diagnosis(**values)


def make_capabilities() -> Capabilities:
    caps = Capabilities()
    caps.set("steps", True)
    caps.set("data_wait", True)
    caps.set("gpu_events", False, CPU_ONLY)
    caps.set("gpu_utilisation", False, CPU_ONLY)
    caps.set("gpm_sm_active", False, CPU_ONLY)
    caps.set("host", True)
    return caps


def make_report(meta: RunMeta | None = None, summary: Summary | None = None, **changes) -> Report:
    chart = StepChart([1250.0] + [316.0] * 199, [1200.0] + [139.0] * 199, warmup_steps=5)
    return Report(
        meta=meta or RunMeta("baseline", "completed", None, 63.2, "cpu"),
        analysis=Analysis(summary or make_summary(), make_diagnosis(**changes)),
        capabilities=make_capabilities(),
        chart=chart,
        notes=["the sampler ran at 10 Hz"],
    )


EXPECTED_TEXT = """\
traceml report: "baseline" completed in 63.2 s, 200 steps (5 warm-up, 195 measured)
Verdict: input-bound (high confidence): Input-bound: the training loop waits for data 44% of step time
  cause: too few DataLoader workers
Evidence:
  - data wait: 44% of step time (139 ms per step)
Advice:
  - Change the training DataLoader: num_workers=0 → num_workers=4, pin_memory=True
Will not help:
  - A faster CPU: the workers are not CPU-bound.
Saving bound: Data waits took 44% of this run (27.8 s of 63.2 s): without them it would take at most 44% less time.
Metrics:
  step time (median)             316 ms (p10 301 ms, p90 342 ms)
  data wait (median)             139 ms
  rest of the step (median)      177 ms
  step phases (median, share)    copy 3.2 ms (1%), forward 52 ms (17%), backward 98 ms (31%), optimizer 14 ms (4%), other 9.5 ms (3%)
  data wait share                44%
  FLOPs per step                 3.1 GFLOP (counted on one step)
  achieved FLOP/s                17.5 GFLOP/s
  throughput                     201 samples/s
  steps per second               3.14 steps/s
  batch size                     64
  first batch (worker start-up)  1.25 s
  main process CPU               98% (100% = one core)
  system CPU                     55%
  CPUs available                 8
  MFU: unavailable (no peak FLOP/s is known for a CPU)
  GPU input stall share, GPU utilisation (median), SM activity (median), GPU memory peak: unavailable (no CUDA device in this run, CPU only)
  DataLoader workers CPU: unavailable (no DataLoader workers (num_workers=0))
  eval (loader 1): 20 batches, 3.5 s
Notes:
  - the sampler ran at 10 Hz"""


class TagChecker(HTMLParser):
    """Fails on a closing tag that does not match the open one; records the tags seen."""

    VOID = {"br", "hr", "img", "meta", "input", "link"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.seen: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.seen.append(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.seen.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1:]}>"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse_html(markup: str) -> TagChecker:
    checker = TagChecker()
    checker.feed(markup)
    checker.close()
    assert checker.stack == [], f"unclosed tags: {checker.stack}"
    return checker


def test_text_report_exact():
    assert render_text(make_report()) == EXPECTED_TEXT


def test_unavailable_metrics_say_why_and_never_zero():
    summary = make_summary(gpu_util_median_pct=None, unavailable={})
    caps = make_capabilities()
    lines = {m.label: m for m in metric_lines(summary, caps)}
    # no reason in the summary: the capability's reason is used
    assert lines["GPU utilisation (median)"].text == f"unavailable ({CPU_ONLY})"
    # neither gives one: a generic reason, still not a number
    assert lines["GPU memory peak"].text == "unavailable (not measured in this run)"
    for line in lines.values():
        if not line.available:
            assert line.text.startswith("unavailable (") and line.text.endswith(")")
            assert not re.search(r"\b0(\.0+)?\b", line.text)


def test_sm_activity_shows_the_gpm_figures_measured_beside_it():
    caps = make_capabilities()
    summary = make_summary(
        sm_active_median_pct=62.0, sm_occupancy_median_pct=40.0, dram_bw_median_pct=30.0
    )
    lines = {m.label: m.text for m in metric_lines(summary, caps)}
    # tensor-core activity was not measured: left out, never 0
    assert lines["SM activity (median)"] == "62% (SM occupancy 40%, DRAM bandwidth 30%)"
    assert "62%" in render_text(make_report(summary=summary))
    t4 = "this GPU has no GPM metrics (Hopper and later GPUs have them)"  # a T4
    summary = make_summary(unavailable={"sm_active_median_pct": t4})
    lines = {m.label: m.text for m in metric_lines(summary, caps)}
    assert lines["SM activity (median)"] == f"unavailable ({t4})"


@pytest.mark.parametrize(
    ("precisions", "said"),
    [({"fp32": 1.0}, ""), ({}, ""), ({"bf16": 1.0}, " in bf16"),
     ({"fp16": 0.98, "fp32": 0.02}, " in fp16 98%, fp32 2%")],
)  # fmt: skip
def test_the_flops_say_the_precision_they_ran_in_where_it_is_not_fp32(precisions, said):
    """On a CPU (no MFU line to say it) the FLOPs of a model run under autocast say their
    precision; full precision goes without saying."""
    summary = make_summary(flop_precisions=precisions)
    lines = {m.label: m.text for m in metric_lines(summary, make_capabilities())}
    assert lines["FLOPs per step"] == f"3.1 GFLOP{said} (counted on one step)"


def test_a_measured_zero_is_shown_as_zero():
    summary = make_summary(data_wait_share=0.0)
    lines = {m.label: m.text for m in metric_lines(summary, make_capabilities())}
    assert lines["data wait share"] == "0%"


def test_a_phase_in_a_quarter_of_the_steps_is_its_time_there_and_how_often_not_0_ms():
    """Gradient accumulation over 4 batches: the optimizer steps on one step in four, so its
    median over the steps is 0 ms beside a share of 12%, which read as a contradiction."""
    summary = make_summary(optimizer_ms_median=0.0, occasional_phases={"optimizer": [0.25, 14.0]})
    lines = {m.label: m.text for m in metric_lines(summary, make_capabilities())}
    assert lines["step phases (median, share)"] == (
        "copy 3.2 ms (1%), forward 52 ms (17%), backward 98 ms (31%), "
        "optimizer 14 ms in 25% of the steps (4%), other 9.5 ms (3%)"
    )


def test_a_copy_not_measured_is_said_beside_the_phases_that_were():
    from traceml_nb.analysis.step_anatomy import NO_COPY

    summary = make_summary(copy_ms_median=None, unavailable={"copy_ms_median": NO_COPY})
    lines = {m.label: m.text for m in metric_lines(summary, make_capabilities())}
    assert lines["step phases (median, share)"] == (
        "forward 52 ms (17%), backward 98 ms (31%), optimizer 14 ms (4%), other 9.5 ms (3%); "
        f"copy unavailable ({NO_COPY})"
    )


def test_html_is_well_formed_and_has_the_chart_and_no_script():
    markup = render_html(make_report())
    checker = parse_html(markup)
    assert "svg" in checker.seen and "path" in checker.seen
    assert "script" not in checker.seen
    text = " ".join(checker.text)
    assert "input-bound" in text
    assert "Input-bound: the training loop waits for data 44% of step time" in text
    assert f"unavailable ({CPU_ONLY})" in text
    assert "Data waits took 44% of this run (27.8 s of 63.2 s)" in text
    assert "Change the training DataLoader: num_workers=0 → num_workers=4, pin_memory=True" in text


def test_html_escapes_user_text():
    meta = RunMeta("<script>alert(1)</script>", "failed", "ValueError: a < b & c", 1.0, "cpu")
    markup = render_html(make_report(meta=meta))
    assert "<script>" not in markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in markup
    assert "ValueError: a &lt; b &amp; c" in markup
    parse_html(markup)


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        (
            "failed",
            "ValueError: boom",
            "Partial report: the cell failed (ValueError: boom); "
            "the numbers cover the 200 steps measured before it stopped.",
        ),
        (
            "interrupted",
            "KeyboardInterrupt",
            "Partial report: the cell was interrupted; "
            "the numbers cover the 200 steps measured before it stopped.",
        ),
    ],
)
def test_partial_report_for_failed_and_interrupted_runs(status, error, expected):
    report = make_report(meta=RunMeta("r", status, error, 5.0, "cpu"))
    assert render_text(report).splitlines()[1] == expected
    assert expected in " ".join(parse_html(render_html(report)).text)


def test_completed_run_has_no_partial_warning():
    assert "Partial report" not in render_text(make_report())
    assert "Partial report" not in render_html(make_report())


def test_insufficient_data_without_steps():
    summary = make_summary(
        total_steps=0,
        warmup_steps=0,
        steady_steps=0,
        step_ms_median=None,
        step_ms_p10=None,
        step_ms_p90=None,
        data_wait_ms_median=None,
        compute_ms_median=None,
        data_wait_share=None,
        unavailable={"step_ms_median": "no training steps seen"},
    )
    report = Report(
        RunMeta("empty", "completed", None, 0.5, "cpu"),
        Analysis(summary, Diagnosis("insufficient-data", Finding("no-steps"), "low")),
        make_capabilities(),
        chart=StepChart([], []),
    )
    text = render_text(report)
    assert (
        text.splitlines()[0] == 'traceml report: "empty" completed in 0.5 s, no training steps seen'
    )
    assert "  step time (median): unavailable (no training steps seen)" in text
    markup = render_html(report)
    assert "<svg" not in markup  # no steps, no chart
    parse_html(markup)


def test_downsample_keeps_at_most_max_bars_and_the_means():
    wall = [float(i % 10) + 10 for i in range(1000)]
    wait = [1.0] * 1000
    bars = downsample(wall, wait)
    assert len(bars.wall_ms) == MAX_BARS
    assert bars.steps_per_bar == 2.5
    # buckets of 2 or 3 steps, each bar the mean of its bucket: the time adds up
    sizes = [b - a for a, b in zip(bars.first_step, [*bars.first_step[1:], 1001], strict=True)]
    assert set(sizes) == {2, 3} and sum(sizes) == 1000
    weighted = sum(m * n for m, n in zip(bars.wall_ms, sizes, strict=True))
    assert weighted == pytest.approx(sum(wall))
    short = downsample([5.0, 6.0], [1.0, 2.0])
    assert short.wall_ms == [5.0, 6.0] and short.data_wait_ms == [1.0, 2.0]


def test_chart_draws_one_bar_per_bucket():
    svg = step_chart_svg(StepChart([100.0] * 5000, [40.0] * 5000))
    compute_path = re.search(r'<path d="([^"]*)" fill="#4c78a8"', svg)
    wait_path = re.search(r'<path d="([^"]*)" fill="#e8833a"', svg)
    assert compute_path and wait_path
    assert compute_path.group(1).count("M") == MAX_BARS
    assert wait_path.group(1).count("M") == MAX_BARS
    assert "each bar: mean of 12.5 steps" in svg
    assert "step 5,000" in svg
    parse_html(svg)


def test_chart_clips_an_outlier_and_shades_warmup():
    svg = step_chart_svg(StepChart([5000.0] + [100.0] * 99, [4900.0] + [10.0] * 99, warmup_steps=3))
    assert "bars above 200 ms clipped" in svg  # 1.5 × 100 ms, rounded up to a nice 200 ms
    assert 'fill="#222222"' in svg  # the clipped bar's cap
    assert ">warm-up</text>" in svg
    no_outlier = step_chart_svg(StepChart([100.0] * 100, [10.0] * 100))
    assert "clipped" not in no_outlier and "warm-up" not in no_outlier


def test_report_displays_as_one_output_with_html_and_text():
    from IPython.core.formatters import DisplayFormatter

    data, _ = DisplayFormatter().format(make_report())
    assert set(data) >= {"text/html", "text/plain"}
    assert data["text/plain"] == EXPECTED_TEXT
    assert "<svg" in data["text/html"]


def history_row(run_id: int, name: str, **changes) -> dict:
    row = dict(
        id=run_id,
        label=f"#{run_id} {name}",
        name=name,
        status="completed",
        started_at=0.0,
        started="12:00:00",
        elapsed_s=63.2,
        total_steps=195,
        steady_steps=190,
        step_ms_median=316.0,
        samples_per_s=201.0,
        data_wait_share=0.44,
        gpu_util_median_pct=None,
        gpu_mem_peak_mb=None,
        verdict="input-bound",
        cause=None,
        previous_id=None,
        step_change=None,
    )
    row.update(changes)
    return row


def test_history_table_html_cells():
    rows = [
        history_row(1, "baseline"),
        history_row(2, "4 workers", step_ms_median=179.0, previous_id=1, step_change=-0.4335),
    ]
    table = HistoryTable(rows, "the text version")
    assert repr(table) == "the text version"
    checker = parse_html(table._repr_html_())
    assert checker.seen.count("tr") == 3
    cells = [c for c in checker.text if c.strip()]
    assert cells[:11] == [
        "run",
        "status",
        "started",
        "time",
        "steps",
        "step",
        "throughput",
        "data wait",
        "GPU util",
        "verdict",
        "vs",
    ]
    assert cells[21:27] == ["#2 4 workers", "completed", "12:00:00", "63.2 s", "195", "179 ms"]
    assert "\u221243% vs #1" in cells  # typographic minus
    assert "\u2014" in cells  # GPU utilisation not measured: a dash, never 0%
    empty = HistoryTable([], "No traceml_nb runs in this session yet.")
    assert "No traceml_nb runs" in empty._repr_html_()


def run_like(run_id: int, step_ms: float, verdict: str, share: float) -> SimpleNamespace:
    """What ``compare`` reads from a history entry, built by hand (steady steps ±1%)."""
    steps = [step_ms * (1 + 0.01 * ((i % 5) - 2)) for i in range(60)]
    summary = make_summary(
        step_ms_median=step_ms, data_wait_share=share, samples_per_s=64000 / step_ms
    )
    return SimpleNamespace(
        id=run_id, summary=summary, diagnosis=make_diagnosis(verdict=verdict), step_ms=steps
    )


def test_report_shows_the_comparison_with_previous_and_best():
    before = run_like(1, 316.0, "input-bound", 0.44)
    best = run_like(2, 150.0, "compute-bound", 0.02)
    after = run_like(3, 179.0, "compute-bound", 0.05)
    report = make_report()
    report.comparisons = [
        LabelledComparison("previous run #1 baseline", compare(before, after)),
        LabelledComparison("best run #2 fast", compare(best, after)),
    ]
    text = render_text(report)
    faster = (
        "step time 316 ms \u2192 179 ms (\u221243%, faster, beyond the run-to-run noise "
        "(\u221241%/+68%: assumed for 316 ms steps until reruns tell))"
    )
    assert f"vs previous run #1 baseline: {faster}" in text
    # +19% against one earlier run, with only the default noise: more runs of this kind cannot
    # narrow the one earlier run's noise enough to tell; what one run against one can tell is
    # said apart from the noise, which is many times smaller
    assert (
        "vs best run #2 fast: step time 150 ms \u2192 179 ms (+19%, inconclusive: 1 run against 1 "
        "can tell only a change beyond \u221241%/+68% at a run-to-run noise of 8.0% (assumed for "
        "150 ms steps until reruns tell); a change this small cannot be told at this noise)" in text
    )
    checker = parse_html(render_html(report))
    joined = " ".join(checker.text)
    assert faster in joined
    assert "input-bound" in joined and "compute-bound" in joined  # the verdict row
    view = ComparisonView("#1 baseline", "#3 tuned", compare(before, after))
    assert repr(view).splitlines()[0] == f"#3 tuned vs #1 baseline: {faster}"
    assert "  median step time: 316 ms \u2192 179 ms (\u221243%)" in repr(view)
    parse_html(view._repr_html_())


def _unavailable_reasons(text: str) -> list[str]:
    """What follows each ``unavailable (`` up to its closing parenthesis."""
    out = []
    for start in [m.end() for m in re.finditer(r"unavailable \(", text)]:
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append(text[start : i - 1])
    return out


def _nvml_failure_reasons() -> list[str]:
    import pynvml

    from traceml_nb.engine.sampling import nvml_binding as nb

    codes = [
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_UNKNOWN,
    ]
    reasons = [nb.init_failure_reason(pynvml.NVMLError(code)) for code in codes]
    return reasons + [nb.init_failure_reason(ImportError()), nb.init_failure_reason(OSError("x"))]


@pytest.mark.parametrize(
    "why",
    [
        NO_CUDA,
        "host CPU and RAM are not sampled: psutil is not installed",
        *_nvml_failure_reasons(),
    ],
)
def test_an_unavailable_reason_never_holds_parentheses_of_its_own(why):
    from builders import RecordBuilder

    from traceml_nb.analysis import analyze

    caps = Capabilities()
    caps.set("steps", True)
    caps.set("data_wait", True)
    for name in ("gpu_events", "gpu_memory", "nvml", "gpu_utilisation", "host"):
        caps.set(name, False, why)
    b = RecordBuilder()
    b.loader(num_workers=0)
    b.steps(40, 20.0, 5.0)
    record = b.finish()
    report = make_report()
    report.analysis = analyze(record, caps, cpus_available=2)
    report.capabilities = caps
    texts = [render_text(report), " ".join(parse_html(render_html(report)).text)]
    reasons = [r for text in texts for r in _unavailable_reasons(text)]
    assert reasons and why in reasons
    assert [r for r in reasons if "(" in r or ")" in r] == []


def test_a_result_prints_as_its_text_report_and_reprs_in_one_line():
    """``print(run.result())`` in a script prints the report; the repr stays one line."""
    import torch

    import traceml_nb

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session = traceml_nb.Session(store=False)
    with session.run("printed", sample=False) as run:
        for _ in range(12):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    res = run.result()
    text = str(res)
    assert text == repr(Report.of(res))
    assert text.startswith("traceml report: #") and '"printed" completed' in text
    assert "Verdict: " in text and "\n" in text
    assert repr(res).startswith("<traceml_nb.RunResult #") and "\n" not in repr(res)


def test_a_multi_line_error_is_one_line_in_the_partial_report():
    from traceml_nb.views.text import one_line, status_sentence

    raised = (
        "ProcessRaisedException: \n\n-- Process 1 terminated with the following error:\n"
        'Traceback (most recent call last):\n  File "x.py", line 3, in f\n'
        "ValueError: boom\n"
    )
    assert one_line(raised) == "ProcessRaisedException: \u2026 ValueError: boom"
    assert one_line("ValueError: boom") == "ValueError: boom"
    said = status_sentence("failed", raised, make_summary(total_steps=3))
    assert said is not None and "\n" not in said
    assert said.startswith("Partial report: the cell failed (ProcessRaisedException: \u2026 ")


def test_a_session_given_no_renderer_prints_a_result_as_its_summary_line():
    """The session layer writes no report: the public ``traceml_nb.Session`` is given the views'
    renderer (``traceml_nb.api``), the layer's own class none, and its results print as their
    one-line summary."""
    import torch

    from traceml_nb.session.session import Session as Bare

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Bare(store=False).run("bare", sample=False) as run:
        for _ in range(12):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    res = run.result()
    assert res.renderer is None and str(res) == repr(res)


def test_an_engine_run_given_no_session_says_where_it_could_report():
    import traceml_nb
    from traceml_nb.engine.run import Run as EngineRun

    engine = EngineRun("alone", sample=False)
    with engine:
        pass
    with pytest.raises(RuntimeError, match="traceml_nb.Run"):
        engine.result()
    with traceml_nb.Run("public", sample=False) as run:
        pass
    assert run.result().name == "public"
    assert traceml_nb.default_session().history.entries[-1].name == "public"
