"""The tracker export without a tracker: the ``--log-to`` option, what every tracker gets (the
payload), and that nothing of it is imported until asked."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from traceml_nb.analysis.findings import Diagnosis, Finding, Summary
from traceml_nb.analysis.input_bound import CAUSE_TOO_FEW_WORKERS
from traceml_nb.session.result import StepArrays
from traceml_nb.session.trackers import (
    Target,
    error_text,
    export,
    parse_log_to,
    resolve_log_to,
)
from traceml_nb.session.trackers.net import unreachable
from traceml_nb.session.trackers.payload import MAX_LOGGED_STEPS, build_payload, downsample, slug
from traceml_nb.views.diagnosis_words import diagnosis_words


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),
        (False, []),
        ("off", []),
        ("", []),
        ("wandb", [Target("wandb")]),
        (" WandB , mlflow ", [Target("wandb"), Target("mlflow")]),
        ("tensorboard:runs/my run", [Target("tensorboard", "runs/my run")]),
        ("tensorboard:C:\\logs", [Target("tensorboard", "C:\\logs")]),
        (["mlflow", "tensorboard"], [Target("mlflow"), Target("tensorboard")]),
        (True, [Target("wandb"), Target("mlflow"), Target("tensorboard")]),
    ],
)
def test_parse_log_to(value, expected):
    assert parse_log_to(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("wandbb", "unknown tracker 'wandbb'"),
        ("mlflow:somewhere", "only tensorboard takes a directory"),
        ("wandb,wandb", "wandb is named twice"),
    ],
)
def test_parse_log_to_refuses(value, message):
    with pytest.raises(ValueError, match=message):
        parse_log_to(value)


def test_resolve_takes_the_first_given_choice_else_the_environment(monkeypatch):
    monkeypatch.setenv("TRACEML_NB_LOG_TO", "mlflow")
    assert resolve_log_to(None, None) == [Target("mlflow")]
    assert resolve_log_to(None, "wandb", "tensorboard") == [Target("wandb")]
    assert resolve_log_to("off", "wandb") == []
    monkeypatch.setenv("TRACEML_NB_LOG_TO", "nope")
    with pytest.raises(ValueError, match="TRACEML_NB_LOG_TO='nope': unknown tracker"):
        resolve_log_to(None)


def test_downsample_keeps_the_ends_and_at_most_k():
    assert downsample(5) == [0, 1, 2, 3, 4]
    picked = downsample(1_000_000)
    assert len(picked) == MAX_LOGGED_STEPS and picked[0] == 0 and picked[-1] == 999_999
    assert picked == sorted(set(picked))
    assert downsample(10, 1) == [9]


def test_slug():
    assert slug("cell [3]") == "cell-3"
    assert slug("4 workers, pinned") == "4-workers-pinned"
    assert slug("///") == "run"


class FakeResult:
    """A RunResult's fields the payload reads (a hand-built CPU run of 3 steps)."""

    name = "resnet"
    status = "completed"
    error = None

    def __init__(self):
        self.summary = Summary(
            step_source="loader",
            total_steps=3,
            warmup_steps=1,
            steady_steps=2,
            elapsed_s=1.5,
            warmup_s=0.2,
            step_ms_median=300.0,
            step_ms_p10=290.0,
            step_ms_p90=310.0,
            step_ms_mean=300.0,
            data_wait_ms_median=120.0,
            compute_ms_median=180.0,
            data_wait_share=0.4,
            first_fetch_ms=50.0,
            batch_size=32,
            samples_per_s=106.7,
            steps_per_s=3.33,
            gpu_stall_share=None,
            gpu_util_median_pct=None,
            gpu_mem_peak_mb=None,
            gpu_mem_total_mb=None,
            process_cpu_median_pct=98.0,
            workers_cpu_median_pct=None,
            system_cpu_median_pct=55.0,
            cpus_available=2,
            unavailable={
                "gpu_stall_share": "no CUDA device in this run, CPU only",
                "gpu_util_median_pct": "no CUDA device in this run, CPU only",
                "workers_cpu_median_pct": "no DataLoader workers, num_workers=0",
            },
        )
        self.diagnosis = Diagnosis(
            verdict="input-bound",
            title=Finding("input-bound", {"input_kind": "host", "input_share": 0.4}),
            confidence="high",
            cause=CAUSE_TOO_FEW_WORKERS,
            advice=[
                Finding(
                    "change-loader",
                    {"changes": [{"setting": "num_workers", "new": 2, "old": 0}], "driver": None},
                )
            ],
            saving_bound_share=0.4,
            saving=Finding(
                "input-saving",
                {"input_kind": "host", "share": 0.4, "wait_s": 0.6, "elapsed_s": 1.5},
            ),
        )
        self.steps = StepArrays(
            start_s=[0.0, 0.3, 0.6, 0.9],
            wall_ms=[400.0, 300.0, 310.0, 50.0],
            data_wait_ms=[200.0, 120.0, 125.0, 5.0],
            compute_ms=[200.0, 180.0, 185.0, 45.0],
            batch=[32, 32, 32, 32],
            gpu_stall_ms=[None, None, None, None],
            phase=["warmup", "train", "train", "eval (loader 1)"],
        )


def test_the_payload_has_the_measured_figures_and_says_why_the_others_are_missing():
    result = FakeResult()
    words = diagnosis_words(result.diagnosis)
    p = build_payload(result, log_steps=True, html="<div>report</div>", words=words)
    assert p.metrics["traceml/step_ms_median"] == 300.0
    assert p.metrics["traceml/data_wait_share"] == 0.4
    assert p.metrics["traceml/saving_bound_share"] == 0.4
    assert p.metrics["traceml/total_steps"] == 3.0
    for missing in (
        "gpu_util_median_pct",
        "sm_active_median_pct",
        "gpu_stall_share",
        "gpu_mem_peak_mb",
        "steal_mean_pct",
    ):
        assert f"traceml/{missing}" not in p.metrics  # never 0
        assert f"traceml/{missing}" in p.skipped
    assert p.skipped["traceml/gpu_util_median_pct"] == "no CUDA device in this run, CPU only"
    assert p.skipped["traceml/gpu_mem_peak_mb"] == "not measured in this run"
    assert p.tags["traceml/verdict"] == "input-bound"
    assert p.tags["traceml/confidence"] == "high"
    assert p.tags["traceml/advice"] == (
        "- Change the training DataLoader: num_workers=0 → num_workers=2"
    )
    assert p.tags["traceml/cause"] == "too few DataLoader workers"
    assert p.tags["traceml/cause_code"] == CAUSE_TOO_FEW_WORKERS
    assert "- traceml/gpu_util_median_pct: no CUDA device in this run, CPU only" in p.text
    assert (
        "**Verdict: input-bound** (high confidence): Input-bound: the training loop waits for "
        "data 40% of step time"
    ) in p.text
    assert "Saving: Data waits took 40% of this run (0.6 s of 1.5 s)" in p.text
    # the run's own 3 steps, not the evaluation batch; the GPU stall series has no value
    assert p.steps == {
        "traceml/steps/step_ms": [(0, 400.0), (1, 300.0), (2, 310.0)],
        "traceml/steps/data_wait_ms": [(0, 200.0), (1, 120.0), (2, 125.0)],
        "traceml/steps/compute_ms": [(0, 200.0), (1, 180.0), (2, 185.0)],
    }
    assert "traceml/steps/gpu_stall_ms: no step has a value" in p.steps_note
    columns, rows = p.step_rows()
    assert columns == ["step", "step_ms", "data_wait_ms", "compute_ms"]
    assert rows[0] == [0, 400.0, 200.0, 200.0]
    assert p.what == "17 metrics, the verdict, the HTML report and 3 steps of 3 series"


def test_flops_with_operators_the_counter_could_not_count_are_logged_as_lower_bounds():
    """The figures are logged as measured; a tag and the text say which operators they leave
    out (a tracker's number has no "at least"), and nothing where the count is whole."""
    result = FakeResult()
    result.summary.flops_per_step, result.summary.achieved_tflops = 2.0e9, 0.5
    assert "traceml/flops_uncounted_ops" not in build_payload(result).tags
    result.summary.uncounted_ops = ["aten::_fft_r2c", "aten::_fft_c2r"]
    p = build_payload(result)
    assert p.metrics["traceml/flops_per_step"] == 2.0e9
    assert p.tags["traceml/flops_uncounted_ops"] == "aten::_fft_r2c, aten::_fft_c2r"
    assert (
        "Lower bounds: traceml/flops_per_step, traceml/achieved_tflops and traceml/mfu leave out "
        "whatever FLOPs these operators did, which the counter has no formula for: "
        "aten::_fft_r2c, aten::_fft_c2r"
    ) in p.text


def test_without_words_the_findings_codes_are_logged():
    p = build_payload(FakeResult())
    assert p.tags["traceml/title"] == "input-bound"
    assert p.tags["traceml/advice"] == "- change-loader"
    assert p.tags["traceml/cause"] == p.tags["traceml/cause_code"] == CAUSE_TOO_FEW_WORKERS


def test_the_gpm_figures_are_logged_where_measured():
    result = FakeResult()
    result.summary.sm_active_median_pct = 62.0
    result.summary.tensor_active_median_pct = 12.0
    p = build_payload(result)
    assert p.metrics["traceml/sm_active_median_pct"] == 62.0
    assert p.metrics["traceml/tensor_active_median_pct"] == 12.0
    assert "traceml/dram_bw_median_pct" in p.skipped  # not measured: left out, never 0


def test_a_phase_that_ran_in_few_of_the_steps_is_logged_where_it_ran_not_as_a_median_of_0():
    result = FakeResult()
    result.summary.forward_ms_median = 90.0
    result.summary.optimizer_ms_median = 0.0  # gradient accumulation: one step in four
    result.summary.occasional_phases = {"optimizer": [0.25, 12.0]}
    p = build_payload(result, words=diagnosis_words(result.diagnosis))
    assert p.metrics["traceml/forward_ms_median"] == 90.0
    assert "traceml/optimizer_ms_median" not in p.metrics  # never a 0 that reads as no time
    assert p.metrics["traceml/optimizer_ms_median_where_ran"] == 12.0
    assert p.metrics["traceml/optimizer_ran_share"] == 0.25
    assert p.skipped["traceml/optimizer_ms_median"].startswith(
        "the optimizer ran in 25% of the steps, so its median over the steps is 0"
    )
    assert "- traceml/optimizer_ms_median: the optimizer ran in 25% of the steps" in p.text
    # a phase that ran in most steps keeps its median, and nothing is added for it
    result.summary.occasional_phases = {}
    result.summary.optimizer_ms_median = 12.0
    p = build_payload(result)
    assert p.metrics["traceml/optimizer_ms_median"] == 12.0
    assert not any("where_ran" in name or "ran_share" in name for name in p.metrics)


def test_a_failing_tracker_is_one_line_and_without_a_renderer_the_text_says_so():
    lines = export(FakeResult(), [Target("tensorboard", "/nonexistent/\0bad")])
    (line,) = lines  # the bad directory fails: one line, no exception
    assert line.startswith("traceml: TensorBoard: not logged, it failed: ValueError")
    p = build_payload(FakeResult(), html_note="no report renderer")
    assert p.html is None and p.text.endswith("No HTML report: no report renderer")


def test_error_text_is_one_short_line():
    text = error_text(RuntimeError("a\nb " + "x" * 1000))
    assert "\n" not in text and len(text) == 300 and text.startswith("RuntimeError: a b x")


def test_unreachable_says_why_and_asks_nothing_of_other_schemes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert "cannot be reached (ConnectionRefusedError" in unreachable(f"http://127.0.0.1:{port}")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert unreachable(f"http://127.0.0.1:{server.getsockname()[1]}/api") is None
    assert unreachable("file:///tmp/mlruns") is None
    assert unreachable("sqlite:///mlflow.db") is None
    assert unreachable("databricks") is None


def test_no_tracker_is_imported_until_asked():
    code = (
        "import sys, traceml_nb, traceml_nb.session, traceml_nb.session.trackers\n"
        "import traceml_nb.session.trackers.payload\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('wandb', 'mlflow', 'tensorboard')"
        " or m.startswith('torch.utils.tensorboard') or m.startswith('traceml_nb.session.trackers.to_')]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    plain = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, traceml_nb; print('traceml_nb.session' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert plain.stdout.strip() == "False"
