"""The GPU self-check: its CPU-only behaviour for real, and its verdict logic on fake numbers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from traceml_nb.engine.record import FLAG_EPOCH_START, FLAG_TRUNCATED, SOURCE_OPTIMIZER
from traceml_nb.selfcheck import overhead
from traceml_nb.selfcheck import paired_stats as stats
from traceml_nb.selfcheck.mapping_child import MARKER
from traceml_nb.selfcheck.nvml import implausible_nvml, nvml_reading, uuid_key, uuid_text
from traceml_nb.selfcheck.overhead import judge_overhead
from traceml_nb.selfcheck.paired_stats import Estimate, paired_added, steady_medians
from traceml_nb.selfcheck.results import (
    ERROR,
    FAIL,
    INFO,
    PASS,
    SKIP,
    WARN,
    Budget,
    CheckResult,
    exit_code,
    format_table,
    run_check,
)
from traceml_nb.selfcheck.sampler import compare_sampler_with_nvml
from traceml_nb.selfcheck.stall import StallCase, expected_stall_ms, judge_stall_case

ROOT = Path(__file__).resolve().parents[2]


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
    # printed (and put in CUDA_VISIBLE_DEVICES) with their dashes
    assert uuid_text("GPU-AbC-1") == "abc-1"
    assert uuid_text(b"GPU-abc-1") == "abc-1"
    assert uuid_text("abc-1") == "abc-1"
    # compared by the sampler's normalise_uuid: hex digits only
    assert uuid_key("GPU-AbC-1") == uuid_key(b"GPU-abc-1") == uuid_key("abc-1") == "abc1"


def test_uuid_key_takes_torchs_uuid_object_by_its_text() -> None:
    class TorchUuid:  # torch's _CUuuid prints the dashed hex without a prefix
        def __str__(self) -> str:
            return "8932f937-d72c-4106-c12f-20bd9faed9f6"

    nvml = "GPU-8932F937-D72C-4106-C12F-20BD9FAED9F6"
    assert uuid_key(TorchUuid()) == uuid_key(nvml) == "8932f937d72c4106c12f20bd9faed9f6"
    assert "GPU-" + uuid_text(TorchUuid()) == "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"


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

    model = overhead.resnet18_like(torch)
    n = sum(p.numel() for p in model.parameters())
    assert n == 11_689_512  # torchvision's resnet18(num_classes=1000)


# --- the package on a CPU-only machine --------------------------------------------------------------
def test_importing_the_self_check_and_its_statistics_loads_no_torch() -> None:
    code = (
        "import sys, traceml_nb.selfcheck, traceml_nb.selfcheck.paired_stats, traceml_nb.selfcheck.cli\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pynvml') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_mapping_child_without_a_visible_device_reports_a_cpu_run_with_a_reason() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "traceml_nb.selfcheck.mapping_child"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    assert len(lines) == 1, proc.stdout
    child = json.loads(lines[0][len(MARKER) :])
    assert child["count"] == 0 and "uuid0" not in child
    assert child["device_kind"] == "cpu"
    assert child["gpu_tables"] == []
    assert child["gpu_events"] is False and child["gpu_events_why"]


# --- stats ----------------------------------------------------------------------------------------
def test_per_step_and_percent_conversions() -> None:
    assert stats.per_step_us(5_000_000, 100) == 50.0  # 5 ms over 100 steps
    assert stats.per_step_us(-1_000, 1) == -1.0
    assert stats.percent_of(5.0, 1000.0) == 0.5
    assert stats.percent_of(-20.0, 80.0) == -25.0


def test_paired_differences_are_variant_minus_plain_pair_by_pair() -> None:
    assert stats.paired_differences([10, 20, 30], [11, 18, 35]) == [1, -2, 5]
    with pytest.raises(ValueError):
        stats.paired_differences([1, 2], [1])
    with pytest.raises(ValueError):
        stats.paired_differences([], [])


def test_quantile_interpolates_between_order_statistics() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # any order
    assert stats.quantile(values, 0.0) == 1.0
    assert stats.quantile(values, 1.0) == 4.0
    assert stats.quantile(values, 0.5) == 2.5
    assert stats.quantile(values, 0.25) == 1.75  # position 0.75 between 1 and 2
    assert stats.quantile([7.0], 0.9) == 7.0
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)
    with pytest.raises(ValueError):
        stats.quantile(values, 1.5)


def test_median_interval_uses_binomial_order_statistics() -> None:
    # n = 10 at 95%: P(Binomial(10, 1/2) <= 1) = 11/1024 <= 2.5%, <= 2 is 56/1024: ranks 2 and 9
    assert stats.median_interval([10, 3, 7, 1, 9, 2, 8, 4, 6, 5]) == Estimate(5.5, 2, 9)
    # n = 20: P(<= 5) = 21700/2**20 <= 2.5%, P(<= 6) is not: ranks 6 and 15
    assert stats.median_interval(list(range(1, 21))) == Estimate(10.5, 6, 15)
    # n = 6: only the whole range reaches 95% (1 - 2/64)
    assert stats.median_interval([6, 5, 4, 3, 2, 1]) == Estimate(3.5, 1, 6)
    # n = 5: too few for 95%; the whole range, said in the docstring
    assert stats.median_interval([5, 1, 4, 2, 3]) == Estimate(3, 1, 5)
    # a lower confidence narrows it: n = 10 at 50%, P(<= 3) = 176/1024 <= 25%: ranks 4 and 7
    assert stats.median_interval(list(range(1, 11)), confidence=0.5) == Estimate(5.5, 4, 7)
    assert stats.median_interval([3.0]) == Estimate(3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        stats.median_interval([])
    with pytest.raises(ValueError):
        stats.median_interval([1.0], confidence=1.0)


def test_added_per_step_us_is_the_median_pair_per_step_with_its_interval() -> None:
    steps = 100
    plain = [1_000_000_000] * 10
    added_ns = [1_000_000 * k for k in (10, 3, 7, 1, 9, 2, 8, 4, 6, 5)]  # 1..10 ms a loop
    variant = [p + a for p, a in zip(plain, added_ns, strict=True)]
    # 1..10 ms over 100 steps: 10..100 us a step; ranks 2 and 9 at 95%
    assert stats.added_per_step_us(plain, variant, steps) == Estimate(55.0, 20.0, 90.0)


def test_median_difference_resamples_whole_pairs() -> None:
    # every pair adds 4 to its block's median: every resample says 4
    plain = [[10.0, 12.0], [11.0, 13.0]]
    variant = [[14.0, 16.0], [15.0, 17.0]]
    assert stats.median_difference(plain, variant) == Estimate(4.0, 4.0, 4.0)
    # pair 0 adds 1, pair 1 adds 3: a resample of pair 0 twice says 1, of pair 1 twice 3,
    # of both 2; each of the first two has probability 1/4, so both ends are reached
    assert stats.median_difference([[10.0], [10.0]], [[11.0], [13.0]]) == Estimate(2.0, 1.0, 3.0)
    with pytest.raises(ValueError):
        stats.median_difference([[1.0]], [[1.0], [2.0]])


def test_bootstrap_interval_is_reproducible_and_spans_the_resampled_statistic() -> None:
    def mean_index(pick: list[int]) -> float:
        return sum(pick) / len(pick)

    first = stats.bootstrap_interval(mean_index, 5, seed=7)
    assert first == stats.bootstrap_interval(mean_index, 5, seed=7)
    assert 0.0 <= first[0] < 2.0 < first[1] <= 4.0
    assert stats.bootstrap_interval(mean_index, 1) == (0.0, 0.0)  # one pair: nothing varies
    with pytest.raises(ValueError):
        stats.bootstrap_interval(mean_index, 0)


def test_paired_added_agrees_with_the_general_functions() -> None:
    plain = [1_000_000_000, 1_100_000_000, 1_000_000_000]
    traced = [1_005_000_000, 1_099_000_000, 1_020_000_000]
    a = paired_added(plain, traced, 100)
    est = stats.added_per_step_us(plain, traced, 100)
    assert (a["median_us"], a["min_us"], a["max_us"]) == tuple(est)  # 3 pairs: the whole range
    assert a["pairs"] == 3
    assert a["min_pct"] == stats.percent_of(-1_000_000, 1_100_000_000)
    assert a["max_pct"] == 2.0


# --- GPM, the samplers' CPU share, the host cost per step ------------------------------------------
def test_gpm_verdict_one_sm_spin_and_full_matmul() -> None:
    from traceml_nb.selfcheck.gpm_check import (
        GPM_MATMUL_MIN_SM_ACTIVE_PCT,
        GPM_SPIN_MAX_SM_ACTIVE_PCT,
        judge_gpm,
    )

    spin = {
        "sm_active_pct": 0.8,
        "sm_occupancy_pct": 0.4,
        "tensor_active_pct": 0.0,
        "dram_bw_pct": 0.1,
    }
    matmul = {
        "sm_active_pct": 97.0,
        "sm_occupancy_pct": 24.0,
        "tensor_active_pct": 71.0,
        "dram_bw_pct": 12.0,
    }
    assert judge_gpm(spin, matmul, 100.0) == ([], [])
    problems, _ = judge_gpm(
        {**spin, "sm_active_pct": GPM_SPIN_MAX_SM_ACTIVE_PCT + 1}, matmul, 100.0
    )
    assert problems == ["SM activity 11.0% for a one-thread kernel (at most 10% expected)"]
    assert judge_gpm({**spin, "sm_active_pct": GPM_SPIN_MAX_SM_ACTIVE_PCT}, matmul, 100.0)[0] == []
    low = {**matmul, "sm_active_pct": GPM_MATMUL_MIN_SM_ACTIVE_PCT - 1}
    assert judge_gpm(spin, low, 100.0)[0] == [
        "SM activity 49.0% during large matrix products (at least 50% expected)"
    ]
    assert (
        judge_gpm(spin, {**matmul, "sm_active_pct": GPM_MATMUL_MIN_SM_ACTIVE_PCT}, 100.0)[0] == []
    )
    problems, warnings = judge_gpm(
        {**spin, "sm_active_pct": None}, {**matmul, "dram_bw_pct": 130.0}, 20.0
    )
    assert problems == [
        "no SM activity during the spin although the GPU has GPM",
        "dram_bw_pct = 130.0 during the matmul is outside 0..100",
    ]
    assert warnings == ["NVML utilisation 20% while a kernel ran throughout"]
    assert judge_gpm(spin, {**matmul, "tensor_active_pct": 0.0}, 100.0)[1] == [
        "no tensor-core activity during half-precision matrix products"
    ]


def test_sampler_gpm_columns_are_measured_exactly_where_the_gpu_has_gpm() -> None:
    from traceml_nb.selfcheck.sampler import gpm_fields

    no_gpm = "this GPU has no GPM metrics (Hopper and later GPUs have them)"
    raw = gpm_fields(no_gpm)
    unavailable = dict.fromkeys(
        ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct"), "unavailable"
    )
    assert compare_sampler_with_nvml(raw, unavailable) == ([], [])
    made_up = {**unavailable, "sm_active_pct": 0.0}
    problems, _ = compare_sampler_with_nvml(raw, made_up)
    assert problems == ["sm_active_pct = 0.0 although NVML does not support gpm_sm_active"]
    raw = gpm_fields("")
    problems, warnings = compare_sampler_with_nvml(raw, unavailable)
    assert problems == [
        "sm_active_pct is unavailable although NVML gives gpm_sm_active = supported"
    ]
    assert len(warnings) == 3  # a GPU with GPM may still not give these one by one
    measured = {k: 10.0 for k in unavailable}
    assert compare_sampler_with_nvml(raw, measured) == ([], [])


def test_sampler_cpu_budget_both_sides() -> None:
    from traceml_nb.selfcheck.sampler_cpu import SAMPLER_CPU_BUDGET_PCT, judge_sampler_cpu

    assert judge_sampler_cpu(SAMPLER_CPU_BUDGET_PCT)
    assert not judge_sampler_cpu(SAMPLER_CPU_BUDGET_PCT + 0.01)


def test_sampler_cpu_shares_are_each_sources_cpu_time() -> None:
    from traceml_nb.selfcheck.sampler_cpu import source_shares

    class Burner:
        def __init__(self, name: str, ms: float) -> None:
            self.name, self.ms = name, ms

        def read(self) -> None:
            end = time.thread_time() + self.ms / 1e3
            while time.thread_time() < end:
                pass

    shares = source_shares([Burner("cheap", 0.0), Burner("dear", 2.0)], 0.5, interval=0.05)
    assert shares["cheap"] < 1.0
    assert 2.0 <= shares["dear"] <= 8.0  # 2 ms of CPU every 50 ms: 4% of a core


def test_host_cost_verdict_both_sides() -> None:
    from traceml_nb.selfcheck.host_cost import (
        HOST_COST_BUDGET_US,
        NEW_EVENTS_PER_FETCHES,
        judge_host_cost,
    )

    assert judge_host_cost(HOST_COST_BUDGET_US, 0, 48, 3000, 64) == []
    assert judge_host_cost(HOST_COST_BUDGET_US + 0.01, 0, 48, 3000, 64) == [
        "adds 10.01 us a step (budget 10 us)"
    ]
    fetches = 3000
    allowed = fetches // NEW_EVENTS_PER_FETCHES
    assert judge_host_cost(1.0, allowed, 48, fetches, 64) == []
    assert judge_host_cost(1.0, allowed + 1, 48, fetches, 64) == [
        "31 CUDA events created for 3000 fetches with a warm pool"
    ]
    assert judge_host_cost(1.0, 0, 3000 // 64 + 8, fetches, 64) == []
    assert judge_host_cost(1.0, 0, 3000, fetches, 64) == [
        "3000 stream look-ups for 3000 fetches (at most 54)"
    ]


def test_the_cuda_calls_are_each_timed_alone_and_a_steps_are_summed_as_the_timer_makes_them() -> (
    None
):
    """Each call the tracer makes, timed ``n`` times in a row on a simulated CUDA (each call
    charges a set time to the clock); the stall timer's step: 2 records, a query, 2 elapsed
    times."""
    import types

    from traceml_nb.selfcheck import cuda
    from traceml_nb.selfcheck.host_cost import STALL_TIMER_CALLS, stall_timer_calls_us

    now = [0]
    made: list[object] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            made.append(self)

        def record(self, stream: object = None) -> None:
            assert stream == "s"
            now[0] += 3000

        def query(self) -> bool:
            now[0] += 500
            return True

        def elapsed_time(self, other: object) -> float:
            now[0] += 1500
            return 0.0

    def current_stream(device: object = None) -> str:
        now[0] += 2000
        return "s"

    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            current_stream=current_stream,
            current_device=lambda: 0,
            synchronize=lambda: None,
            Event=Event,
        )
    )
    costs = cuda.cuda_call_costs_us(fake, n=10, clock=lambda: now[0])
    assert costs == {
        "current_stream": 2.0,
        "new_event_record_free": 3.0,
        "record_reused_event": 3.0,
        "query": 0.5,
        "elapsed_time": 1.5,
    }
    assert len(made) == 2 + 10  # the two reused, and one a call of the cold pool's
    assert STALL_TIMER_CALLS == {"record_reused_event": 2, "query": 1, "elapsed_time": 2}
    assert stall_timer_calls_us(costs) == 2 * 3.0 + 0.5 + 2 * 1.5


def test_the_self_check_lists_every_check_once() -> None:
    from traceml_nb.selfcheck.cli import CHECKS

    names = [name for name, _check, _needs in CHECKS]
    assert names == [
        "env", "stall", "nvml", "gpm", "sampler", "samplercpu", "mapping", "hostcost", "anatomy",
        "formulas", "overhead",
    ]  # fmt: skip
    assert all(len(name) <= 10 for name in names)  # the table's column


def test_the_anatomy_checks_hand_count_and_its_rules_on_both_sides() -> None:
    """The FLOPs by hand are FlopCounterMode's for the same stack (run here on the CPU); each
    rule of the verdict on both sides of its tolerance."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from traceml_nb.selfcheck.anatomy_check import (
        FLOP_TOLERANCE,
        MFU_TOLERANCE,
        MIN_TIMED_STEPS,
        PHASE_NAMES,
        PHASE_SLACK_MS,
        PHASE_TOLERANCE,
        AnatomyFigures,
        hand_flops,
        judge_anatomy,
    )

    layers: list = []
    for _ in range(3):
        layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(8, 16)).float().pow(2).mean().backward()
    assert counter.get_total_flops() == hand_flops(8, 16, 3)

    hand = {name: 10.0 for name in PHASE_NAMES}

    def figures(**changes) -> AnatomyFigures:
        base = dict(
            flops=1e12, hand_flops=1e12, mfu=0.5, hand_mfu=0.5, timed_steps=MIN_TIMED_STEPS,
            phases_ms=dict(hand), hand_phases_ms=dict(hand),
        )  # fmt: skip
        return AnatomyFigures(**{**base, **changes})

    assert judge_anatomy(figures()) == []
    assert judge_anatomy(figures(flops=1e12 * (1 + FLOP_TOLERANCE * 0.99))) == []
    assert judge_anatomy(figures(flops=1e12 * (1 + FLOP_TOLERANCE * 1.01)))
    assert judge_anatomy(figures(flops=None))
    assert judge_anatomy(figures(mfu=0.5 * (1 - MFU_TOLERANCE * 0.99))) == []
    assert judge_anatomy(figures(mfu=0.5 * (1 - MFU_TOLERANCE * 1.01)))
    assert judge_anatomy(figures(mfu=None))
    assert judge_anatomy(figures(mfu=None, hand_mfu=None)) == []  # a GPU with no tabled peak
    assert judge_anatomy(figures(timed_steps=MIN_TIMED_STEPS - 1))
    near = {**hand, "backward": 10.0 * (1 + PHASE_TOLERANCE * 0.99)}
    far = {**hand, "backward": 10.0 * (1 + PHASE_TOLERANCE * 1.01)}
    assert judge_anatomy(figures(phases_ms=near)) == []
    assert judge_anatomy(figures(phases_ms=far)) == [
        "backward 11.010 ms on the GPU, by hand 10.000 ms"
    ]
    tiny = {**hand, "copy": 0.01}
    assert judge_anatomy(figures(phases_ms={**tiny, "copy": 0.01 + PHASE_SLACK_MS * 0.99},
                                 hand_phases_ms=tiny)) == []  # fmt: skip
    assert judge_anatomy(figures(phases_ms={**tiny, "copy": 0.01 + PHASE_SLACK_MS * 1.2},
                                 hand_phases_ms=tiny))  # fmt: skip
    assert judge_anatomy(figures(phases_ms={}))  # no timed phase at all fails


def test_the_formulas_check_judges_both_sides_and_measures_on_a_cpu() -> None:
    """The GPU check's rule on both sides of its tolerance, and its measurement where it can
    run here: oneDNN's fused LSTM against the same LSTM as matrix products (on a GPU, cuDNN's
    LSTM and GRU)."""
    import warnings

    import torch

    from traceml_nb.selfcheck.formulas_check import (
        FORMULA_TOLERANCE,
        judge_formulas,
        layer_counts,
    )

    products = 1_000_000
    assert judge_formulas({"LSTM": (products, products)}) == []
    assert (
        judge_formulas({"LSTM": (int(products * (1 + FORMULA_TOLERANCE * 0.99)), products)}) == []
    )
    assert judge_formulas({"LSTM": (int(products * (1 + FORMULA_TOLERANCE * 1.01)), products)})
    assert judge_formulas({"GRU": (0, products)}) and judge_formulas({"GRU": (products, 0)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (oneDNN's flags' note on TF32 for Intel GPUs)
        counts, precisions = layer_counts(torch, "cpu")
    assert list(counts) == ["LSTM"] and judge_formulas(counts) == []
    assert precisions == {"LSTM": "fp32"}
