"""The ``stall`` check: the CUDA-event input-stall measurement against injected delays.

A dataset whose ``__getitem__`` sleeps ``D`` ms (``num_workers=0``) feeds a step that runs a
tiny model (launch-bound: the GPU keeps up with the host) and then queues a GPU spin of a
calibrated ``Q`` ms (``torch.cuda._sleep``). When the next fetch begins exactly ``Q`` ms of
GPU work is queued, so the GPU idles for ``max(0, wait - Q)``: the measured median stall must
be that within ``max(1 ms, 15% of D)``; the span must be ``max(GPU work, host time between
fetches)`` within ``max(1 ms, 20%)``. Cases: ``Q = 0``, ``Q = D/2``, ``Q = 3D``.

The verdict (:func:`judge_stall_case`) is a pure function of the numbers, tested without a GPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from .cuda import elapsed_ms, spin_cycles_per_ms, torch_module
from .paired_stats import steady_medians
from .results import FAIL, PASS, SKIP, Budget, CheckResult

STALL_TOLERANCE_MIN_MS = 1.0
STALL_TOLERANCE_FRACTION = 0.15  #: of the injected data delay
SPAN_TOLERANCE_MIN_MS = 1.0
SPAN_TOLERANCE_FRACTION = 0.20  #: of the expected span


# --- pure verdicts -------------------------------------------------------------------------------
def expected_stall_ms(wait_ms: float, queued_ms: float) -> float:
    """GPU idle time per step when the host waits ``wait_ms`` for a batch while ``queued_ms``
    of GPU work is still queued from the previous step: that part of the wait overlaps GPU
    work, only the rest of it is a stall."""
    return max(0.0, wait_ms - queued_ms)


def stall_tolerance_ms(data_ms: float) -> float:
    return max(STALL_TOLERANCE_MIN_MS, STALL_TOLERANCE_FRACTION * data_ms)


def span_tolerance_ms(span_ms: float) -> float:
    return max(SPAN_TOLERANCE_MIN_MS, SPAN_TOLERANCE_FRACTION * span_ms)


def expected_span_ms(gpu_ms: float, host_ms: float | None) -> float:
    """GPU time from a batch's arrival to the next fetch: the step's GPU work, or the host's
    own time between the fetches when launching is slower than the GPU (launch-bound)."""
    return max(gpu_ms, host_ms or 0.0)


@dataclass
class StallCase:
    """One stall scenario and what was measured (all ms; medians over the steady steps).

    The step's host part (a tiny model, launch-bound) comes first and its last GPU work is a
    spin of ``queued_ms``, so when the next fetch begins exactly the spin is still queued.
    """

    name: str
    data_ms: float  #: injected sleep per batch
    queued_ms: float  #: calibrated GPU spin left queued when the fetch begins
    gpu_ms: float  #: calibrated GPU timeline of one step's work, from CUDA events
    stall_ms: float | None = None  #: measured median gpu_stall_ms
    span_ms: float | None = None  #: measured median gpu_span_ms
    wait_ms: float | None = None  #: measured median host data wait
    host_ms: float | None = None  #: measured median host time of a step outside the fetch
    rows: int = 0  #: steady steps the medians are taken over
    unresolved: int = 0  #: steps whose events never resolved (NaN)


def judge_stall_case(case: StallCase) -> tuple[bool, str]:
    """Whether the measured stall and span match the injected timeline; and a one-line why.

    Expected stall: ``max(0, host wait - queued GPU work)`` within ``max(1 ms, 15% of the
    injected delay)``; expected span: ``max(calibrated GPU work, host time between fetches)``
    within ``max(1 ms, 20%)``; the host wait itself: the injected delay within the stall
    tolerance.
    """
    head = f"{case.name}: data {case.data_ms:.1f} ms, queued GPU {case.queued_ms:.1f} ms"
    if case.rows == 0 or case.stall_ms is None or case.span_ms is None:
        return False, f"{head}: no resolved steps to judge"
    if case.unresolved:
        return False, f"{head}: {case.unresolved} step(s) with unresolved GPU events"
    wait = case.wait_ms if case.wait_ms is not None else case.data_ms
    expected = expected_stall_ms(wait, case.queued_ms)
    tol = stall_tolerance_ms(case.data_ms)
    problems = []
    if abs(case.stall_ms - expected) > tol:
        problems.append(f"stall {case.stall_ms:.2f} ms, expected {expected:.2f} +/- {tol:.2f}")
    span = expected_span_ms(case.gpu_ms, case.host_ms)
    span_tol = span_tolerance_ms(span)
    if abs(case.span_ms - span) > span_tol:
        problems.append(f"span {case.span_ms:.2f} ms, expected {span:.2f} +/- {span_tol:.2f}")
    if abs(wait - case.data_ms) > tol:
        problems.append(f"host wait {wait:.2f} ms, expected {case.data_ms:.2f} +/- {tol:.2f}")
    if problems:
        return False, f"{head}: " + "; ".join(problems)
    return True, (
        f"{head}: stall {case.stall_ms:.2f} ms (expected {expected:.2f} +/- {tol:.2f}), "
        f"span {case.span_ms:.2f} ms (expected {span:.2f}), host wait {wait:.2f} ms"
    )


# --- the measurement (needs CUDA) ----------------------------------------------------------------
class _SleepyDataset:
    """``__getitem__`` sleeps ``sleep_s`` and returns the index: the injected data delay."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n = n
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.sleep_s)
        return i


class _GpuWork:
    """One step's GPU work: a tiny model's forward/backward/SGD step (launch-bound: the GPU
    keeps up with the host), then a GPU spin of ``spin_cycles`` queued last."""

    def __init__(self, torch: Any, device: Any, spin_cycles: int) -> None:
        nn = torch.nn
        self.torch = torch
        self.model = nn.Linear(256, 256).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(64, 256, device=device)
        self.spin_cycles = spin_cycles

    def __call__(self) -> None:
        loss = self.model(self.x).square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.spin_cycles > 0:
            self.torch.cuda._sleep(self.spin_cycles)

    def gpu_ms(self, repeats: int = 5) -> tuple[float, float]:
        """Median GPU time of one whole call and of its spin alone, from CUDA events
        (synchronises: calibration only)."""
        torch = self.torch
        whole, spin = [], []
        for _ in range(repeats):
            torch.cuda.synchronize()
            whole.append(elapsed_ms(torch, self))
            if self.spin_cycles > 0:
                spin.append(elapsed_ms(torch, lambda: torch.cuda._sleep(self.spin_cycles)))
        return statistics.median(whole), (statistics.median(spin) if spin else 0.0)


def run_stall_case(
    torch: Any, name: str, data_ms: float, gpu_target_ms: float, rate: float, steps: int
) -> StallCase:
    """Train ``steps`` batches under a ``Run`` and collect the measured stall medians."""
    from torch.utils.data import DataLoader

    from ..engine.run import Run

    device = torch.device("cuda", torch.cuda.current_device())
    work = _GpuWork(torch, device, int(gpu_target_ms * rate))
    work()
    gpu_ms, queued_ms = work.gpu_ms()
    dataset: Any = _SleepyDataset(steps, data_ms / 1e3)
    loader: Any = DataLoader(dataset, batch_size=None, num_workers=0)
    torch.cuda.synchronize()
    with Run(f"selfcheck-{name}", device=device.index, sample=False) as run:
        for _batch in loader:
            work()
    cols = run.record.steps.snapshot()
    medians = steady_medians(
        cols.source, cols.flags, cols.gpu_stall_ms, cols.gpu_span_ms, cols.wait_ns, cols.wall_ns
    )
    return StallCase(name, data_ms, queued_ms, gpu_ms, **medians)


def check_stall(budget: Budget) -> CheckResult:
    torch = torch_module()
    if not hasattr(torch.cuda, "_sleep"):
        return CheckResult("stall", SKIP, "torch.cuda._sleep is missing: no calibrated GPU work")
    rate = spin_cycles_per_ms(torch)
    plan = [  # (name, injected data delay ms, GPU spin queued last in each step ms)
        ("no-overlap", 20.0, 0.0),  # input-bound: the GPU idles for the whole wait
        ("half-overlap", 20.0, 10.0),  # half the wait is covered by queued GPU work
        ("gpu-bound", 10.0, 30.0),  # the wait is hidden behind GPU work: no stall
    ]
    cases: list[StallCase] = []
    failed: list[str] = []
    lines: list[str] = []
    steps = 24
    for name, data_ms, spin_ms in plan:
        if not budget.allows(steps * max(data_ms, spin_ms) / 1e3 * 2 + 5):
            failed.append(f"{name}: out of time budget")
            continue
        case = run_stall_case(torch, name, data_ms, spin_ms, rate, steps)
        ok, line = judge_stall_case(case)
        cases.append(case)
        lines.append(("ok   " if ok else "FAIL ") + line)
        print("  " + lines[-1], flush=True)
        if not ok:
            failed.append(line)
    details = {"spin_cycles_per_ms": rate, "cases": [asdict(c) for c in cases], "lines": lines}
    if failed:
        return CheckResult("stall", FAIL, "; ".join(failed), details)
    return CheckResult(
        "stall", PASS, f"{len(cases)}/{len(plan)} injected-delay cases match", details
    )
