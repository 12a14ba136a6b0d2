"""The ``samplercpu`` check: what the samplers cost, as a share of one core, at the default
rate (10 Hz) on a busy GPU.

A ``Run`` with its samplers on for ``SAMPLER_CPU_RUN_S`` (several periods of the fields read
once a second): the sampler thread's CPU time (``Run.sampler_busy_s``) over the run's duration
must be at most ``SAMPLER_CPU_BUDGET_PCT``. Then each source alone (the GPU's NVML and GPM
reads, the host's ``/proc`` reads), read at 10 Hz on this thread for ``SOURCE_RUN_S``: its CPU
share, to tell which one costs what.
"""

from __future__ import annotations

import time
from typing import Any

from .cuda import busy_gpu, torch_module
from .results import FAIL, PASS, Budget, CheckResult

SAMPLER_CPU_BUDGET_PCT = 1.0  #: of one core, the samplers together at 10 Hz
SAMPLER_CPU_RUN_S = 6.0
SOURCE_RUN_S = 3.0
INTERVAL_S = 0.1  #: the default sampling rate, 10 Hz


def judge_sampler_cpu(share_pct: float, budget_pct: float = SAMPLER_CPU_BUDGET_PCT) -> bool:
    """The samplers pass when their thread's CPU time is at most ``budget_pct`` percent of
    the run's duration."""
    return share_pct <= budget_pct


def source_shares(
    sources: list[Any], seconds: float, interval: float = INTERVAL_S
) -> dict[str, float]:
    """Each source's CPU time over ``seconds`` of reads every ``interval`` on this thread, as a
    percentage of one core."""
    spent = {src.name: 0.0 for src in sources}
    due = time.monotonic()
    end = due + seconds
    while due < end:
        for src in sources:
            c0 = time.thread_time()
            try:
                src.read()
            except Exception:
                pass  # a lost source costs what it cost
            spent[src.name] += time.thread_time() - c0
        due += interval
        time.sleep(max(0.0, due - time.monotonic()))
    return {name: 100.0 * cpu_s / seconds for name, cpu_s in spent.items()}


def check_sampler_cpu(budget: Budget) -> CheckResult:
    torch = torch_module()

    from ..engine.capabilities import Capabilities
    from ..engine.record import RunRecord
    from ..engine.run import Run
    from ..engine.sampling import open_sources

    index = torch.cuda.current_device()
    busy_gpu(torch, 1e3 * (SAMPLER_CPU_RUN_S + SOURCE_RUN_S + 2.0))
    with Run("selfcheck-sampler-cpu", device=index, sample=True, interval=INTERVAL_S) as run:
        time.sleep(SAMPLER_CPU_RUN_S)
    share = 100.0 * run.sampler_busy_s / max(run.elapsed_s, 1e-9)
    caps = Capabilities()
    sources = open_sources(RunRecord(), caps, [index])
    try:
        shares = source_shares(sources, SOURCE_RUN_S)
    finally:
        for src in sources:
            src.close()
    torch.cuda.synchronize()
    parts = ", ".join(f"{name} {pct:.2f}%" for name, pct in shares.items())
    print(
        f"  samplers {share:.2f}% of a core over {run.elapsed_s:.1f} s; alone: {parts}", flush=True
    )
    ok = judge_sampler_cpu(share)
    details = {
        "share_pct": share,
        "budget_pct": SAMPLER_CPU_BUDGET_PCT,
        "run_s": run.elapsed_s,
        "sampler_busy_s": run.sampler_busy_s,
        "per_source_pct": shares,
        "gpm": caps.ok("gpm") or caps.why("gpm"),
    }
    summary = (
        f"samplers {share:.2f}% of a core at 10 Hz (budget {SAMPLER_CPU_BUDGET_PCT:.0f}%); "
        f"each alone: {parts}"
    )
    return CheckResult("samplercpu", PASS if ok else FAIL, summary, details)
