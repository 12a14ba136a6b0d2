"""The live header while the run goes on: its step count, the chart's rows and the running
verdict come from the same rows at every tick, from the first step on; before a verdict it
says it is collecting, and a steady run's verdict does not flip."""

from __future__ import annotations

import re
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import traceml_nb
from traceml_nb.analysis.pipeline import Analysis
from traceml_nb.analysis.thresholds import MIN_STEADY_STEPS
from traceml_nb.views.live.charts import header_html
from traceml_nb.views.live.verdict import RunningVerdict, collecting_text
from traceml_nb.views.live.view import LiveView


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        time.sleep(0.001)
        return torch.randn(8), torch.randn(1)


def header_parts(view: LiveView) -> tuple[int, str]:
    """(steps, verdict part) as the header shows them."""
    text = view.charts.header.text
    steps = int(
        re.search(r'class="traceml-steps">([\d,]+) steps?<', text).group(1).replace(",", "")
    )
    verdict = re.search(r'class="traceml-verdict">([^<]*)<', text)
    return steps, verdict.group(1) if verdict else ""


def test_header_chart_and_verdict_agree_at_every_tick(monkeypatch):
    import traceml_nb.analysis as analysis_pkg

    real = analysis_pkg.analyze
    analysed: list[int] = []  # the steps each running analysis saw

    def counting(snapshot, capabilities, **kwargs) -> Analysis:
        analysis = real(snapshot, capabilities, **kwargs)
        analysed.append(analysis.summary.total_steps)
        return analysis

    monkeypatch.setattr(analysis_pkg, "analyze", counting)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ticks: list[tuple[int, int, str]] = []
    with traceml_nb.Run("header", sample=False) as run:
        view = LiveView(
            run, display=False, settle_s=0, analysis_interval_s=0.0, analysis_max_duty=1.0
        )
        view.start(background=False)
        for k, (x, y) in enumerate(DataLoader(Sleepy(), batch_size=4)):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            before = len(analysed)
            assert view.tick()
            steps, verdict = header_parts(view)
            chart_rows = len(view.charts.steps.data["step"])
            ticks.append((steps, chart_rows, verdict))
            # the chart holds every step the header counts (one point a step: k is 1)
            assert view.step_series.k == 1 and chart_rows == steps, (k, steps, chart_rows)
            if len(analysed) > before:  # the verdict of this tick saw the very same rows
                assert analysed[-1] == steps, (k, analysed[-1], steps)
            assert "No training steps" not in verdict
            if verdict.startswith("collecting"):
                assert verdict == collecting_text(steps)
            else:
                assert verdict.startswith("verdict so far: ") and steps > MIN_STEADY_STEPS
            if k == 39:
                break
    view.stop()
    counts = [steps for steps, _, _ in ticks]
    # the header follows the loop: each tick sees the steps closed by then
    assert counts == sorted(counts) and counts[-1] >= 38
    assert counts[0] <= 1  # from the first step on
    shown = [v.split(":")[0] for _, _, v in ticks]
    assert shown[0] == "collecting" and shown[-1] == "verdict so far"
    switches = sum(1 for a, b in zip(shown, shown[1:], strict=False) if a != b)
    assert switches == 1  # collecting, then a verdict: no flip-flop on a steady run
    verdicts = {v for _, _, v in ticks if v.startswith("verdict")}
    assert len({v.split(":")[1] for v in verdicts}) == 1, verdicts  # one kind of verdict
    final_steps, final_verdict = header_parts(view)
    assert final_steps == 40 and final_verdict.startswith("verdict: ")


def _analysis(verdict: str, steady: int, mfu: float | None = None, uncounted: tuple = ()):
    from types import SimpleNamespace

    from traceml_nb.analysis.findings import TEXT, Diagnosis, Finding

    title = Finding(TEXT, {"text": verdict.title()})
    summary = SimpleNamespace(steady_steps=steady, mfu=mfu, uncounted_ops=list(uncounted))
    return Analysis(summary, Diagnosis(verdict, title, "high"))  # type: ignore[arg-type]


def test_the_header_gives_the_mfu_once_the_flops_were_counted_on_a_known_gpu():
    v = RunningVerdict()
    v.update(_analysis("compute-bound", 3))
    assert v.mfu is None
    v.update(_analysis("compute-bound", 4, mfu=0.231))
    v.update(_analysis("compute-bound", 5))  # an analysis without it keeps the one known
    assert v.mfu == 0.231
    line = header_html("r", "running", 5, 1.0, 2.0, v.text(5, running=True), mfu=v.mfu)
    assert '<span class="traceml-mfu">MFU 23%</span>' in line
    assert "traceml-mfu" not in header_html("r", "running", 5, 1.0, 2.0, "")


def test_the_header_reads_the_mfu_as_a_lower_bound_where_the_report_does():
    v = RunningVerdict()
    kernel = "xformers::efficient_attention_forward_cutlass"
    v.update(_analysis("compute-bound", 4, mfu=0.231, uncounted=(kernel,)))
    assert v.mfu_at_least  # an operator without a formula ran: its FLOPs are not in the count
    line = header_html("r", "running", 5, 1.0, 2.0, "", mfu=v.mfu, mfu_at_least=v.mfu_at_least)
    assert '<span class="traceml-mfu">MFU at least 23%</span>' in line
    v.update(_analysis("compute-bound", 5, mfu=0.25))  # a later count that missed nothing
    assert v.mfu == 0.25 and not v.mfu_at_least


def test_running_verdict_waits_for_enough_steady_steps_and_a_confirmed_change():
    v = RunningVerdict(confirmations=2)
    assert v.text(0, running=True) == "collecting: 0 steps so far, a verdict after 10 steady steps"
    assert v.text(1, running=True) == "collecting: 1 step so far, a verdict after 10 steady steps"
    v.update(_analysis("input-bound", MIN_STEADY_STEPS - 1))
    assert v.shown is None  # one steady step short: still collecting
    v.update(_analysis("input-bound", MIN_STEADY_STEPS))
    assert v.text(12, running=True) == "verdict so far: Input-Bound"
    v.update(_analysis("compute-bound", 40))  # once: near a threshold, maybe
    assert v.shown == "input-bound"
    v.update(_analysis("input-bound", 41))
    v.update(_analysis("compute-bound", 42))  # not twice in a row yet
    assert v.shown == "input-bound"
    v.update(_analysis("compute-bound", 43))  # twice in a row: the evidence changed
    assert v.shown == "compute-bound"
    v.update(_analysis("host-bound", 44), final=True)  # the run's end: shown at once
    assert v.text(44, running=False) == "verdict: Host-Bound"
    assert RunningVerdict().text(3, running=False) == ""


@pytest.mark.parametrize("steps", [0, 1, 2, 9])
def test_collecting_text_says_the_count_in_words(steps):
    text = collecting_text(steps)
    assert text.startswith(f"collecting: {steps} step{'' if steps == 1 else 's'} so far")
