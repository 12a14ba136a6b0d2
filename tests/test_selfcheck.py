"""The GPU self-check: its CPU-only behaviour for real, and its verdict logic on fake numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from traceml_nb import selfcheck
from traceml_nb.record import FLAG_EPOCH_START, FLAG_TRUNCATED, SOURCE_OPTIMIZER
from traceml_nb.selfcheck import (
    ERROR,
    FAIL,
    INFO,
    PASS,
    SKIP,
    WARN,
    Budget,
    CheckResult,
    StallCase,
    compare_sampler_with_nvml,
    exit_code,
    expected_stall_ms,
    format_table,
    implausible_nvml,
    judge_overhead,
    judge_stall_case,
    normalise_uuid,
    nvml_reading,
    paired_added,
    run_check,
    steady_medians,
)

ROOT = Path(__file__).resolve().parent.parent


def test_cpu_only_machine_says_so_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "selfcheck.json"
    proc = subprocess.run(
        [sys.executable, "-m", "traceml_nb.selfcheck", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA" in proc.stdout
    report = json.loads(out.read_text())
    assert report["exit_code"] == 0
    assert report["checks"][0]["status"] == SKIP


# --- stall verdicts -------------------------------------------------------------------------------
def test_expected_stall_is_the_part_of_the_wait_not_covered_by_queued_gpu_work() -> None:
    assert expected_stall_ms(20.0, 0.0) == pytest.approx(20.0)
    assert expected_stall_ms(20.4, 10.0) == pytest.approx(10.4)
    assert expected_stall_ms(10.0, 30.0) == 0.0


def _case(**kw: float) -> StallCase:
    base = dict(
        name="c",
        data_ms=20.0,
        queued_ms=10.0,
        gpu_ms=12.0,
        stall_ms=10.4,
        span_ms=12.2,
        wait_ms=20.1,
        rows=20,
    )
    base.update(kw)
    return StallCase(**base)  # type: ignore[arg-type]


def test_stall_within_tolerance_passes() -> None:
    ok, why = judge_stall_case(_case())
    assert ok, why
    assert "expected 10.10 +/- 3.00" in why  # measured host wait 20.1 - queued 10


def test_stall_outside_tolerance_fails_and_says_what_was_expected() -> None:
    ok, why = judge_stall_case(_case(stall_ms=14.0))  # 3.9 ms off; tolerance is 15% of 20 ms
    assert not ok
    assert "stall 14.00 ms, expected 10.10 +/- 3.00" in why


def test_small_delays_get_the_one_millisecond_floor() -> None:
    small = dict(data_ms=4.0, queued_ms=0.0, gpu_ms=0.5, span_ms=0.6, wait_ms=4.1)
    assert judge_stall_case(_case(stall_ms=4.9, **small))[0]  # 0.8 ms off, floor 1 ms
    ok, why = judge_stall_case(_case(stall_ms=5.3, **small))
    assert not ok and "expected 4.10 +/- 1.00" in why


def test_gpu_bound_case_expects_no_stall() -> None:
    bound = dict(data_ms=10.0, queued_ms=30.0, gpu_ms=32.0, span_ms=30.5, wait_ms=10.1)
    assert judge_stall_case(_case(stall_ms=0.02, **bound))[0]
    ok, why = judge_stall_case(_case(stall_ms=9.0, **bound))
    assert not ok and "expected 0.00" in why


def test_wrong_span_or_host_wait_fails() -> None:
    ok, why = judge_stall_case(_case(span_ms=16.0))
    assert not ok and "span 16.00 ms, expected 12.00 +/- 2.40" in why
    ok, why = judge_stall_case(_case(wait_ms=30.0, stall_ms=20.0))
    assert not ok and "host wait 30.00 ms, expected 20.00" in why


def test_launch_bound_span_is_the_host_time_between_fetches() -> None:
    # the GPU work takes 1.1 ms but the host needs 1.9 ms to launch it: the span is 1.9
    bound = dict(data_ms=20.0, queued_ms=0.0, gpu_ms=1.1, stall_ms=20.4, wait_ms=20.3)
    assert judge_stall_case(_case(span_ms=1.88, host_ms=1.9, **bound))[0]
    ok, why = judge_stall_case(_case(span_ms=4.5, host_ms=1.9, **bound))
    assert not ok and "expected 1.90 +/- 1.00" in why


def test_unresolved_events_or_no_rows_fail() -> None:
    assert not judge_stall_case(_case(unresolved=2))[0]
    ok, why = judge_stall_case(_case(rows=0, stall_ms=None, span_ms=None))
    assert not ok and "no resolved steps" in why


def test_steady_medians_skip_warm_up_other_sources_and_truncated_rows() -> None:
    nan = math.nan
    source = [0, 0, 0, 0, SOURCE_OPTIMIZER, 0, 0, 0]
    flags = [FLAG_EPOCH_START, 0, 0, 0, 0, 0, 0, FLAG_TRUNCATED]
    stall = [99.0, 99.0, 99.0, 10.0, 77.0, 12.0, nan, 55.0]
    span = [1.0, 1.0, 1.0, 5.0, 77.0, 7.0, nan, 55.0]
    wait = [int(20e6)] * 8
    wall = [int(22e6)] * 8
    m = steady_medians(source, flags, stall, span, wait, wall, slot=0, skip=3)
    assert m["rows"] == 3  # rows 3, 5, 6: the optimizer row and the truncated one are out
    assert m["unresolved"] == 1
    assert m["stall_ms"] == pytest.approx(11.0)
    assert m["span_ms"] == pytest.approx(6.0)
    assert m["wait_ms"] == pytest.approx(20.0)
    assert m["host_ms"] == pytest.approx(2.0)


# --- overhead verdicts -----------------------------------------------------------------------------
def test_paired_added_uses_each_repetition_pair() -> None:
    steps = 100
    plain = [1_000_000_000, 1_100_000_000, 1_000_000_000]
    traced = [1_005_000_000, 1_099_000_000, 1_020_000_000]
    a = paired_added(plain, traced, steps)
    assert a["median_us"] == pytest.approx(50.0)  # pairs: +50, -10, +200 us a step
    assert a["min_us"] == pytest.approx(-10.0)
    assert a["max_us"] == pytest.approx(200.0)
    assert a["median_pct"] == pytest.approx(0.5)
    assert a["plain_step_ms"] == pytest.approx(10.0)
    assert judge_overhead(a, budget_pct=1.0)
    assert not judge_overhead(a, budget_pct=0.4)


def test_paired_added_refuses_unpaired_input() -> None:
    with pytest.raises(ValueError):
        paired_added([1, 2], [1], 10)
    with pytest.raises(ValueError):
        paired_added([], [], 10)


# --- NVML -----------------------------------------------------------------------------------------
def _raise(exc: Exception):  # type: ignore[no-untyped-def]
    def read() -> None:
        raise exc

    return read


def test_nvml_reading_tells_unsupported_from_errors() -> None:
    assert nvml_reading(lambda: 42) == (42, "")
    assert nvml_reading(_raise(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))) == (
        None,
        "unsupported",
    )
    value, why = nvml_reading(_raise(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)))
    assert value is None and why.startswith("error: NVMLError_GpuIsLost")


GOOD = {
    "util_gpu_pct": 100,
    "util_memory_pct": 3,
    "memory_used_mb": 1200.0,
    "memory_total_mb": 143771.0,
    "power_w": 180.0,
    "power_limit_w": 700.0,
    "sm_clock_mhz": 1980,
    "sm_clock_max_mhz": 1980,
    "temperature_c": 35,
    "pcie_rx_kbps": 1000,
    "pcie_tx_kbps": 20,
}


def test_plausible_nvml_values_pass_and_unsupported_fields_are_not_judged() -> None:
    assert implausible_nvml(GOOD, busy=True) == []
    partial = dict(GOOD, util_gpu_pct=None, util_memory_pct=None, power_w=None)  # MIG-like
    assert implausible_nvml(partial, busy=True) == []


@pytest.mark.parametrize(
    ("change", "busy", "words"),
    [
        ({"util_gpu_pct": 0}, True, "reads 0 while a kernel kept the GPU busy"),
        ({"util_gpu_pct": 130}, False, "outside 0..100"),
        ({"memory_used_mb": 200000.0}, False, "memory used"),
        ({"memory_total_mb": None}, False, "memory total is not readable"),
        ({"power_w": 5000.0}, False, "power 5000.0 W"),
        ({"sm_clock_mhz": 2500}, False, "above its maximum"),
        ({"temperature_c": 0}, False, "temperature"),
        ({"pcie_rx_kbps": -1}, False, "negative"),
    ],
)
def test_implausible_nvml_values_are_named(change: dict, busy: bool, words: str) -> None:
    problems = implausible_nvml(dict(GOOD, **change), busy=busy)
    assert any(words in p for p in problems), problems


def test_idle_gpu_may_read_zero_utilisation() -> None:
    assert implausible_nvml(dict(GOOD, util_gpu_pct=0), busy=False) == []


RAW = {
    "util_gpu_pct": (100, ""),
    "util_memory_pct": (None, "unsupported"),
    "memory_used_mb": (1429.9, ""),
    "memory_total_mb": (143771.0, ""),
    "pcie_rx_kbps": (487, ""),
}


def test_sampler_columns_must_match_what_nvml_supports() -> None:
    sampled = {
        "util_gpu_pct": 100.0,
        "util_mem_pct": "unavailable",
        "mem_used_mb": 1430.0,
        "mem_total_mb": 143771.0,
        "pcie_rx_mbps": 0.2,
    }
    assert compare_sampler_with_nvml(RAW, sampled) == ([], [])


def test_sampler_problems_are_named() -> None:
    sampled = {
        "util_gpu_pct": "unavailable",  # NVML gives it: the sampler lost it
        "util_mem_pct": 0.0,  # NVML does not support it: a made-up number
        "mem_used_mb": 1430.0,
        "mem_total_mb": 80000.0,  # another GPU's memory?
        "pcie_rx_mbps": "unavailable",  # sparse column: only a warning
    }
    problems, warnings = compare_sampler_with_nvml(RAW, sampled)
    assert any("util_gpu_pct is unavailable although NVML gives" in p for p in problems)
    assert any("util_mem_pct = 0.0 although NVML does not support" in p for p in problems)
    assert any("mem_total_mb 80000 differs" in p for p in problems)
    assert warnings == ["pcie_rx_mbps is unavailable although NVML gives pcie_rx_kbps = 487"]


def test_a_renamed_sampler_column_is_a_warning() -> None:
    problems, warnings = compare_sampler_with_nvml({"util_gpu_pct": (100, "")}, {})
    assert problems == [] and warnings == ["the sampler has no column 'util_gpu_pct'"]


def test_uuids_compare_without_nvml_prefix() -> None:
    assert normalise_uuid("GPU-AbC-1") == "abc-1"
    assert normalise_uuid(b"GPU-abc-1") == "abc-1"
    assert normalise_uuid("abc-1") == "abc-1"


# --- driver ---------------------------------------------------------------------------------------
def test_exit_code_fails_on_fail_or_error_only() -> None:
    ok = [
        CheckResult("a", PASS, ""),
        CheckResult("b", INFO, ""),
        CheckResult("c", WARN, ""),
        CheckResult("d", SKIP, ""),
    ]
    assert exit_code(ok) == 0
    assert exit_code(ok + [CheckResult("e", FAIL, "")]) == 1
    assert exit_code(ok + [CheckResult("e", ERROR, "")]) == 1


def test_table_names_the_failed_checks() -> None:
    table = format_table(
        [CheckResult("stall", FAIL, "off by 5 ms"), CheckResult("nvml", PASS, "14/14")]
    )
    assert "stall      FAIL" in table
    assert "result: FAILED (stall)" in table
    assert "all checks passed" in format_table([CheckResult("nvml", PASS, "")])


def test_a_crashing_check_becomes_an_error_and_a_late_one_is_skipped() -> None:
    def crash(budget: Budget) -> CheckResult:
        raise RuntimeError("boom")

    result = run_check("x", crash, Budget(10.0), needs_s=1)
    assert result.status == ERROR and "RuntimeError: boom" in result.summary
    assert "boom" in result.details["traceback"]
    skipped = run_check("y", crash, Budget(0.5), needs_s=5)
    assert skipped.status == SKIP


def test_budget_counts_down_on_its_clock() -> None:
    now = [100.0]
    budget = Budget(10.0, clock=lambda: now[0])
    assert budget.allows(10.0)
    now[0] = 105.0
    assert budget.remaining() == pytest.approx(5.0)
    assert not budget.allows(6.0)


def test_resnet18_like_has_resnet18s_parameter_count() -> None:
    import torch

    model = selfcheck.resnet18_like(torch)
    n = sum(p.numel() for p in model.parameters())
    assert n == 11_689_512  # torchvision's resnet18(num_classes=1000)
