"""``--profile N``: torch.profiler over N steady steps, summarised into the report.

The capture runs the real ``torch.profiler`` on the CPU; the GPU parts of the summary (kernel
gaps, synchronising calls) are fed capture records, as a GPU's profiler would leave them.
"""

from __future__ import annotations

import gzip
import inspect
import json
import sys

import numpy as np
import pytest
import torch
from builders import make_summary

import traceml_nb
from traceml_nb.analysis.profile_summary import (
    LOADER_OP,
    PROFILE_SUGGESTION,
    gpu_idle_share,
    profile_cause,
    suggests_profile,
    summarize_profile,
)
from traceml_nb.analysis.thresholds import (
    GPU_BUSY_PCT,
    LAUNCH_BOUND_IDLE_SHARE,
    PROFILE_TOP_OPS,
    SYNC_CAUSE_SHARE,
)
from traceml_nb.engine.instrument.profiler import ProfileWindow
from traceml_nb.engine.profile_capture import OpTotals, ProfileCapture, SyncTotals
from traceml_nb.views.diagnosis_words import diagnosis_words, sentence
from traceml_nb.views.report import Report


def profiler_on() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled)


# --- the summary of a capture (pure) -----------------------------------------------------------
def gpu_capture(sync_share: float = 0.0, idle_share: float = 0.0) -> ProfileCapture:
    """10 profiled steps of 10 ms on a GPU: ``sync_share`` of the time waiting in ``.item()``
    at line 7, kernels leaving the GPU idle ``idle_share`` of the time."""
    wall = 100_000.0
    busy = wall * (1 - idle_share)
    kernels = [(i * wall / 50, i * wall / 50 + busy / 50) for i in range(50)]
    ops = [
        OpTotals("aten::addmm", 300, 40_000.0, 30_000.0, {(5, "line 5 in forward"): 40_000.0}),
        OpTotals("aten::_local_scalar_dense", 10, 500.0, 0.0, {(7, "line 7"): 500.0}),
        OpTotals("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10, 4_000.0),
        OpTotals("cudaStreamSynchronize", 10, wall * sync_share, 0.0, {(7, "line 7"): 1.0}),
    ]
    syncs = [SyncTotals("aten::item", 7, 10, wall * sync_share)] if sync_share else []
    return ProfileCapture(
        requested=10,
        after_steps=10,
        steps=10,
        window_ns=(1_000_000, 200_000_000),
        wall_us=wall,
        activities=("cpu", "cuda"),
        ops=ops,
        syncs=syncs,
        kernels=kernels,
        loader_us=5_000.0,
        trace_path="traceml_profiles/run.pt.trace.json.gz",
        trace_bytes=123_456,
        source_lines={5: "out = model(x)", 7: "total += loss.item()"},
    )


def test_gpu_idle_share_merges_overlapping_kernels():
    assert gpu_idle_share([(0, 10), (5, 20), (30, 40)], 100) == pytest.approx(0.7)
    assert gpu_idle_share([(0, 100)], 100) == 0.0
    assert gpu_idle_share([], 100) is None
    assert gpu_idle_share([(0, 1)], 0) is None


def test_a_sync_at_the_threshold_is_named_with_its_line_and_below_it_is_not():
    at = summarize_profile(gpu_capture(sync_share=SYNC_CAUSE_SHARE))
    assert at is not None
    found = profile_cause(at, "host-bound")
    assert found is not None and found.code == "profile-sync"
    assert found.facts["sync"]["line"] == 7
    cause = sentence(found)
    assert cause.startswith("line 7 (`total += loss.item()`) waits for the GPU every step")
    assert "1 ms of 10 ms a step" in cause
    below = summarize_profile(gpu_capture(sync_share=SYNC_CAUSE_SHARE * 0.9))
    found = profile_cause(below, "host-bound")
    assert found is not None and found.code == "profile-top-op"
    cause_below = sentence(found)
    assert "waits for the GPU" not in cause_below
    assert cause_below.startswith("`aten::addmm` takes 40%")
    assert "called from line 5 (`out = model(x)`), in line 5 in forward" not in cause_below


def test_an_idle_gpu_names_a_launch_bound_host_on_both_sides_of_the_threshold():
    idle = summarize_profile(gpu_capture(idle_share=LAUNCH_BOUND_IDLE_SHARE + 0.01))
    found = profile_cause(idle, "host-bound")
    assert found is not None and found.code == "profile-launch-bound"
    cause = sentence(found)
    assert "does not launch work fast enough" in cause
    assert "`aten::addmm`" in cause
    busy = summarize_profile(gpu_capture(idle_share=LAUNCH_BOUND_IDLE_SHARE - 0.01))
    found_busy = profile_cause(busy, "host-bound")
    assert found_busy is not None and found_busy.code != "profile-launch-bound"
    assert "launch" not in sentence(found_busy)


def test_only_host_and_compute_bound_verdicts_name_a_cause():
    profile = summarize_profile(gpu_capture(sync_share=0.3))
    assert profile_cause(profile, "compute-bound") is not None
    for verdict in ("input-bound", "throttled", "memory-pressure", "insufficient-data"):
        assert profile_cause(profile, verdict) is None
    assert profile_cause(None, "host-bound") is None


def test_the_summary_shares_are_of_the_profiled_time():
    profile = summarize_profile(gpu_capture(sync_share=0.2, idle_share=0.5))
    assert profile is not None and profile.captured
    assert profile.step_ms == pytest.approx(10.0)
    top = profile.top_cpu[0]
    assert (top.name, top.line, top.code) == ("aten::addmm", 5, "out = model(x)")
    assert top.share == pytest.approx(0.4) and top.ms_per_step == pytest.approx(4.0)
    assert top.calls_per_step == 30
    assert profile.top_gpu[0].name == "aten::addmm"
    assert profile.top_gpu[0].share == pytest.approx(0.3)
    assert LOADER_OP in [op.name for op in profile.top_cpu]
    assert profile.gpu_idle_share == pytest.approx(0.5)
    assert profile.loader_share_profiler == pytest.approx(0.05)
    (sync,) = profile.syncs
    assert (sync.op, sync.line, sync.calls_per_step) == ("aten::item", 7, 1)
    assert sync.ms_per_step == pytest.approx(2.0)


def test_the_top_lists_are_bounded():
    capture = gpu_capture()
    capture.ops = [OpTotals(f"op{i}", 1, float(i + 1)) for i in range(3 * PROFILE_TOP_OPS)]
    profile = summarize_profile(capture)
    assert profile is not None and len(profile.top_cpu) == PROFILE_TOP_OPS
    assert profile.top_cpu[0].name == f"op{3 * PROFILE_TOP_OPS - 1}"


def test_a_missing_capture_says_why():
    capture = ProfileCapture(requested=10, after_steps=10, why="another profiler is active")
    profile = summarize_profile(capture)
    assert profile is not None and not profile.captured
    assert profile.why == "another profiler is active"
    assert summarize_profile(None) is None


def test_the_rerun_suggestion_on_both_sides_of_its_rules():
    summary = make_summary(gpu_util_median_pct=GPU_BUSY_PCT - 1)
    assert suggests_profile(summary, "host-bound", "high")
    assert suggests_profile(summary, "compute-bound", "high")
    assert not suggests_profile(
        make_summary(gpu_util_median_pct=GPU_BUSY_PCT), "compute-bound", "high"
    )
    assert not suggests_profile(make_summary(gpu_util_median_pct=None), "compute-bound", "high")
    assert suggests_profile(make_summary(), "input-bound", "low")
    assert not suggests_profile(make_summary(), "input-bound", "high")
    assert not suggests_profile(make_summary(), "insufficient-data", "low")


def test_the_report_shows_the_gpu_profile():
    from traceml_nb.analysis.findings import Diagnosis, Finding
    from traceml_nb.analysis.pipeline import Analysis
    from traceml_nb.engine.capabilities import Capabilities
    from traceml_nb.views.html import render_html
    from traceml_nb.views.report_content import ReportContent, RunMeta
    from traceml_nb.views.text import render_text

    profile = summarize_profile(gpu_capture(sync_share=0.2, idle_share=0.4))
    diagnosis = Diagnosis("host-bound", Finding("text", {"text": "Host-bound"}), "high")
    diagnosis.profiled_cause = profile_cause(profile, "host-bound")
    report = ReportContent(
        RunMeta("run", "completed"),
        Analysis(make_summary(), diagnosis),
        Capabilities(),
        profile=profile,
    )
    text = render_text(report)
    assert "profile: line 7 (`total += loss.item()`) waits for the GPU every step" in text
    assert "Profile: 10 steps of 10 ms under torch.profiler" in text
    assert "top operators by GPU time" in text
    assert "waits for the GPU: aten::item at line 7 (`total += loss.item()`): 2 ms a step" in text
    assert "GPU idle between kernels: 40% of the profiled time" in text
    assert "trace: traceml_profiles/run.pt.trace.json.gz, 0.12 MB" in text
    html = render_html(report)
    assert "top operators by host time" in html and "loss.item()" in html


# --- the window on the real profiler -----------------------------------------------------------
def test_the_window_counts_the_loops_own_boundaries():
    window = ProfileWindow(2, 3, cuda=False, t0_ns=0)
    window.boundary("fetch")
    window.boundary("optimizer")  # not the loop's kind of boundary: ignored
    window.boundary("fetch")
    window.boundary("fetch")
    assert window.state == "pending" and not profiler_on()
    window.boundary("fetch")
    assert window.state == "open" and profiler_on()
    window.boundary("fetch")
    window.boundary("fetch")
    assert window.done and not profiler_on()
    capture = window.finish()
    assert capture.steps == 2 and capture.why == ""


def test_markers_take_over_before_the_window_opens():
    window = ProfileWindow(1, 2, cuda=False, t0_ns=0)
    window.boundary("fetch")
    window.boundary("fetch")
    window.boundary("marker")  # a custom loop's steps: counted from here
    assert window.state == "pending" and window.kind == "marker"
    window.boundary("marker")
    window.boundary("marker")
    assert window.state == "open"
    window.end()
    assert not profiler_on()


def test_an_active_profiler_is_left_alone_and_said():
    window = ProfileWindow(2, 0, cuda=False, t0_ns=0)
    with torch.profiler.profile() as theirs:
        window.boundary("fetch")
        torch.ones(3).sum()
    assert window.done and "another profiler is already active" in window.why
    assert any(e.name == "aten::sum" for e in theirs.events())
    assert not window.finish().captured


# --- a real run ---------------------------------------------------------------------------------
class PerSample(torch.nn.Module):
    """A model whose forward loops over the samples in Python: slow on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.lin(x[i]) for i in range(len(x))])


class PerSampleBookkeeping(PerSample):
    """...with pure-Python work for each sample: its forward's Python time is then ~4x the
    backward's (share 0.37-0.39 against at most 0.11, idle or with a core busy); without it the
    two were near level, and a loaded machine put the backward's matmuls first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(len(x)):
            sum(range(5000))
            out.append(self.lin(x[i]))
        return torch.stack(out)


def loader(batches: int) -> torch.utils.data.DataLoader:
    data = torch.utils.data.TensorDataset(
        torch.randn(16 * batches, 16), torch.randn(16 * batches, 4)
    )
    return torch.utils.data.DataLoader(data, batch_size=16)


def train(
    run_options: dict,
    batches: int = 60,
    fail_at: int | None = None,
    model_class: type[torch.nn.Module] = PerSample,
) -> traceml_nb.Run:
    """The loop under a run; raises at batch ``fail_at``."""
    torch.manual_seed(0)
    model = model_class()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    session = traceml_nb.Session(store=False)
    with session.run("per-sample", sample=False, **run_options) as run:
        for i, (x, y) in enumerate(loader(batches)):
            if i == fail_at:
                raise ValueError("boom")
            loss = torch.nn.functional.mse_loss(model(x), y)  # LOSS_LINE
            loss.backward()
            opt.step()
            opt.zero_grad()
    return run


LOSS_LINE = next(
    i
    for i, text in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1)
    if text.strip().endswith("# LOSS_LINE")
)


def test_a_run_names_the_slow_python_line_and_writes_the_profiled_steps_only(tmp_path):
    options = {"profile": 5, "profile_after": 10, "profile_dir": str(tmp_path)}
    run = train(options, model_class=PerSampleBookkeeping)
    result = run.result()
    profile = result.profile
    assert profile is not None and profile.captured and profile.steps == 5, profile
    top = profile.top_cpu[0]
    assert top.line == LOSS_LINE, profile.top_cpu[:3]
    assert "model(x)" in (top.code or "")
    assert top.python and "forward" in (top.frame or ""), top  # the per-sample loop's line
    assert any(op.name == "aten::addmm" and op.line == LOSS_LINE for op in profile.top_cpu)
    assert result.diagnosis.profiled_cause is not None
    assert f"line {LOSS_LINE}" in sentence(result.diagnosis.profiled_cause)
    text = repr(Report.of(result))
    assert f"line {LOSS_LINE}: loss = torch.nn.functional.mse_loss(model(x), y)" in text
    # the trace: valid gzipped JSON holding the 5 profiled fetches and no other
    assert profile.trace_path is not None and profile.trace_path.startswith(str(tmp_path))
    with gzip.open(profile.trace_path, "rt") as f:
        trace = json.load(f)
    fetches = [
        e
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith("enumerate(DataLoader)")
    ]
    assert len(fetches) == 5
    assert profile.trace_bytes is not None and profile.trace_bytes < 2_000_000
    assert not profiler_on() and sys.gettrace() is None


def test_profiled_steps_are_left_out_of_the_statistics(tmp_path):
    plain = train({}, batches=80).result()
    profiled_run = train(
        {"profile": 8, "profile_after": 10, "profile_dir": str(tmp_path)}, batches=80
    )
    profiled = profiled_run.result()
    s = profiled.summary
    # the 8 profiled steps and the one the profiler started at the end of
    assert s.profiled_steps == 9
    assert s.steady_steps == (
        s.total_steps - s.warmup_steps - s.profiled_steps - s.flop_counted_steps
    )
    assert profiled.steps.phase.count("train, profiled") == 9
    assert plain.summary.profiled_steps == 0
    # the profiler slowed its steps; the statistics are of the other steps only (within the
    # run: the median of another run moves by half on a busy machine)
    assert profiled.profile is not None and profiled.profile.step_ms is not None
    assert profiled.profile.step_ms > s.step_ms_median
    steps = profiled.steps
    phases = zip(steps.wall_ms, steps.phase, strict=True)
    train_ms = [ms for ms, phase in phases if phase == "train"]
    assert len(train_ms) == s.steady_steps
    assert s.step_ms_median == pytest.approx(float(np.median(train_ms)))
    assert "9 steps that ran under the profiler are left out of the statistics." in (
        diagnosis_words(profiled.diagnosis).also
    )


def test_a_run_shorter_than_the_wait_says_so(tmp_path):
    run = train({"profile": 5, "profile_after": 10, "profile_dir": str(tmp_path)}, batches=6)
    profile = run.result().profile
    assert profile is not None and not profile.captured
    assert profile.why == "the run ended after 6 steps, before the 10 steps the capture waits for"
    assert run.result().summary.profiled_steps == 0
    assert "Profile: unavailable: the run ended after 6 steps" in repr(Report.of(run.result()))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("error", "ended_by"),
    [(ValueError, "the run failed"), (KeyboardInterrupt, "the run was interrupted")],
)
def test_a_run_that_ends_inside_the_window_stops_the_profiler(tmp_path, error, ended_by):
    runs: list[traceml_nb.Run] = []
    model = PerSample()
    session = traceml_nb.Session(store=False)
    with pytest.raises(error):
        with session.run(
            "ends", sample=False, profile=5, profile_after=3, profile_dir=str(tmp_path)
        ) as run:
            runs.append(run)
            for i, (x, _) in enumerate(loader(20)):
                if i == 5:
                    raise error("stop")
                model(x).sum().backward()
    assert not profiler_on() and sys.gettrace() is None
    capture = runs[0].record.profile
    assert capture is not None and capture.steps == 2
    assert capture.why == f"{ended_by} after 2 of the 5 profiled steps"
    profile = runs[0].result().profile
    assert (
        profile is not None
        and profile.captured
        and f"partial: {capture.why}" in (repr(Report.of(runs[0].result())))
    )
    assert capture.trace_path is not None and capture.trace_path.startswith(str(tmp_path))


class _WhatTheProfiledWorkerDoes(torch.utils.data.Dataset):
    """Each item, in a DataLoader worker: whether a trace function is set on its thread, and
    how much its memory grew over 20,000 tensor operators after 2,000 first ones (MiB): a
    recording profiler keeps ~1.3 KB of each (26 MiB); none, a few pages."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        import psutil

        x = torch.zeros(4)
        for _ in range(2_000):  # past the first operators' own allocations
            x = x + 1
        before = psutil.Process().memory_info().rss
        for _ in range(20_000):
            x = x + 1
        grew = (psutil.Process().memory_info().rss - before) / 2**20
        return torch.tensor([float(sys.gettrace() is not None), grew])


def test_a_worker_forked_while_the_window_profiles_neither_records_nor_traces(tmp_path):
    """An evaluation's loader first iterated inside the window (its persistent worker ran 7x
    slower and grew 1.3 KB an operator for the session, never read) leaves both."""
    pytest.importorskip("psutil")
    model = torch.nn.Linear(16, 4)
    val = torch.utils.data.DataLoader(
        _WhatTheProfiledWorkerDoes(), batch_size=1, num_workers=1, multiprocessing_context="fork"
    )
    session = traceml_nb.Session(store=False)
    with session.run("forks", sample=False, profile=4, profile_after=2, profile_dir=str(tmp_path)):
        for i, (x, _) in enumerate(loader(10)):
            model(x).sum().backward()
            if i == 3:
                assert profiler_on()  # the window is open
                with torch.no_grad():
                    seen = torch.cat(list(val))
    traced, grew = seen[:, 0], seen[:, 1]
    assert traced.tolist() == [0.0, 0.0]
    # 32-34 MiB each before; an item grew 22 MiB once on a loaded machine, the other 1 MiB
    assert float(grew.min()) < 8, grew
    assert not profiler_on() and sys.gettrace() is None


def test_a_debuggers_trace_function_is_kept_and_the_lines_go_unnamed(tmp_path):
    def tracer(frame, event, arg):
        return None

    sys.settrace(tracer)
    try:
        run = train({"profile": 3, "profile_after": 5, "profile_dir": str(tmp_path)}, batches=12)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    assert run.record.profile is not None
    assert "another trace function" in run.record.profile.lines_why
    profile = run.result().profile
    assert profile is not None and profile.captured
    assert all(op.line is None for op in profile.top_cpu)


def test_an_unprofiled_run_with_little_data_suggests_a_profile():
    run = train({}, batches=20)
    advice = run.result().diagnosis.codes()
    assert run.result().diagnosis.confidence == "low"
    assert PROFILE_SUGGESTION in advice
    profiled = train({"profile": 2, "profile_after": 2}, batches=20).result()
    assert PROFILE_SUGGESTION not in profiled.diagnosis.codes()


# --- the magic, in a real IPython shell --------------------------------------------------------
#: A model whose forward loops over the samples in Python, each with some pure-Python
#: bookkeeping: its Python time (cell line 3, the call) is then about three times the
#: backward's own (line 4), 7.5-9.0 ms a step against 2.4-3.3 ms, on any machine, idle or
#: loaded; without the bookkeeping the two were level (2.4 and 2.3 ms) and a loaded machine put
#: line 4 first.
MAGIC_SETUP = """
import torch
def bookkeeping(i):
    total = 0
    for k in range(300):
        total += k * i
    return total
class PerSample(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)
    def forward(self, x):
        return torch.stack([self.lin(x[i]) for i in range(len(x)) if bookkeeping(i) >= 0])
torch.manual_seed(0)
model = PerSample()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dl = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(1920, 16), torch.randn(1920, 4)), batch_size=64
)
"""

PROFILED_CELL = """%%traceml --profile 5 --view none -o res
for x, y in dl:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
steps_done = len(dl)
"""


def test_the_magic_profiles_and_names_the_cell_line(capsys, tmp_path):
    from ipython_shell import traceml_shell

    with traceml_shell(MAGIC_SETUP) as shell:
        result = shell.run_cell(PROFILED_CELL)
        assert result.success, result.error_in_exec
        res = shell.user_ns["res"]
        assert shell.user_ns["steps_done"] == 30 and "loss" in shell.user_ns
        out = capsys.readouterr().out
        profile = res.profile
        assert profile is not None and profile.steps == 5, profile
        # the model's forward is another cell's: its Python time is that of line 3's call
        top = profile.top_cpu[0]
        assert top.line == 3 and "model(x)" in (top.code or ""), profile.top_cpu[:3]
        assert "Profile: 5 steps of" in out
        assert "line 3: loss = torch.nn.functional.mse_loss(model(x), y)" in out
        assert res.summary.profiled_steps == 6
        assert profile.trace_path is not None and profile.trace_path.startswith(str(tmp_path))

        # inside someone else's profiler: theirs keeps working, ours says why it is missing
        result = shell.run_cell(
            "%%traceml --profile 3 --view none -o res2\n"
            "with torch.profiler.profile() as theirs:\n"
            "    for x, y in dl:\n"
            "        model(x).sum().backward()\n"
        )
        assert result.success, result.error_in_exec
        assert shell.user_ns["theirs"].events()
        res2 = shell.user_ns["res2"]
        assert res2.profile is not None and not res2.profile.captured
        assert "another profiler is already active" in res2.profile.why
        assert "Profile: unavailable: another profiler is already active" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "error"),
    [("--profile 0", "must be at least 1 step"), ("--profile two", "must be a number of steps")],
)
def test_a_bad_profile_option_is_a_usage_error(line, error):
    from IPython.core.error import UsageError
    from ipython_shell import traceml_shell

    with traceml_shell("x = 1") as shell:
        magic = shell.find_cell_magic("traceml")
        with pytest.raises(UsageError, match=error):
            magic(line, "x = 2")
        assert shell.user_ns["x"] == 1


def test_profile_without_a_number_profiles_ten_steps():
    from traceml_nb.engine.instrument.profiler import DEFAULT_PROFILE_STEPS
    from traceml_nb.notebook.cell_options import parse_options
    from traceml_nb.notebook.magic import TraceMLMagics

    options = parse_options(TraceMLMagics.traceml_cell, "--profile --name x")
    assert options.run.profile == DEFAULT_PROFILE_STEPS == 10 and options.name == "x"
    assert parse_options(TraceMLMagics.traceml_cell, "").run.profile is None


def test_once_the_window_closes_the_fetch_is_the_plain_wrapper_again(tmp_path):
    import torch.optim.optimizer as optim_mod
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from traceml_nb.engine.instrument import hooks

    def window_hooks() -> int:
        posthooks = optim_mod._global_optimizer_post_hooks.values()
        return sum("_window_hook" in getattr(h, "__qualname__", "") for h in posthooks)

    session = traceml_nb.Session(store=False)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session.run("gate", sample=False, profile=2, profile_after=2, profile_dir=str(tmp_path)):
        installed = hooks._installed
        assert installed is not None and installed.gate is not None
        assert _BaseDataLoaderIter.__dict__["__next__"] is installed.gate
        assert window_hooks() == 1
        for x, _ in loader(8):
            model(x).sum().backward()
            opt.step()
        assert _BaseDataLoaderIter.__dict__["__next__"] is installed.wrapper
        assert window_hooks() == 0


def test_a_build_without_kineto_is_said(monkeypatch):
    monkeypatch.setattr(torch.autograd, "kineto_available", lambda: False)
    window = ProfileWindow(2, 0, cuda=False, t0_ns=0)
    window.boundary("fetch")
    assert window.done and not profiler_on()
    capture = window.finish()
    assert not capture.captured and capture.why == "this PyTorch build has no Kineto profiler"
