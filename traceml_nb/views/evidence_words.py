"""The evidence of a diagnosis in words: the sentence of each
:class:`~traceml_nb.analysis.findings.Evidence` detail's code, from its facts (what follows
``label:`` in the report's evidence list)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..analysis.advice import setting_named_in
from ..analysis.findings import UNAVAILABLE
from ..analysis.formatting import fmt_mb, fmt_ms, fmt_pct, fmt_share, plural

Facts = dict[str, Any]


def _s(n: int) -> str:
    return "s" if n != 1 else ""


def _reasons(reasons: list[str], none: str) -> str:
    return ", ".join(reasons) or none


def _step_time(f: Facts) -> str:
    """``median 11.5 ms (p10 …, p90 …)``; where the loader's workers hand over their batches
    in turn, over blocks of whole rounds of them (``analysis.step_blocks``)."""
    text = f"median {fmt_ms(f['median_ms'])} (p10 {fmt_ms(f['p10_ms'])}, p90 {fmt_ms(f['p90_ms'])})"
    if f.get("block"):
        text += (
            f" of the means of blocks of {f['block']} steps: the {f['workers']} workers hand over"
            " their batches in turn, so a step alone may be a round's long wait or one of its"
            " fast steps"
        )
    return text


def _input_share(f: Facts) -> str:
    """``44% of step time (13.2 ms per step)``; with stalls left out, both shares."""
    text = f"{fmt_share(f['share'])} of step time ({fmt_ms(f['per_step_ms'])} per step)"
    steps = f.get("stall_steps")
    if not steps:
        return text
    if len(steps) == 1:
        stalls, them = f"the stall at step {steps[0]}", "it"
    else:
        listed = f"{', '.join(map(str, steps[:-1]))} and {steps[-1]}"
        stalls, them = f"the {len(steps)} stalls at steps {listed}", "them"
    return f"{text} without {stalls}, {fmt_share(f['share_with_stalls'])} with {them}"


def _sm_activity(f: Facts) -> str:
    """SM activity with the other GPM medians that were measured."""
    others = [
        f"{name} {fmt_pct(f[key])}"
        for name, key in (
            ("SM occupancy", "occupancy_pct"),
            ("tensor cores", "tensor_pct"),
            ("DRAM bandwidth", "dram_bw_pct"),
        )
        if f.get(key) is not None
    ]
    extra = f"; {', '.join(others)}" if others else ""
    return f"median {fmt_pct(f['pct'])} of the SMs busy during the steady steps (GPM{extra})"


#: The words of each evidence detail's code, from its facts.
EVIDENCE_SENTENCES: dict[str, Callable[[Facts], str]] = {
    UNAVAILABLE: lambda f: f"unavailable ({f['why']})",
    "steady-steps": lambda f: (
        f"{f['steps']} ({f['warmup_steps']} warm-up step{_s(f['warmup_steps'])} excluded)"
    ),
    "step-time": _step_time,
    "input-share": _input_share,
    "gpu-utilisation": lambda f: f"median {fmt_pct(f['pct'])} during the steady steps",
    "sm-activity": _sm_activity,
    "no-loader": lambda f: "no DataLoader seen",
    "loader": lambda f: (
        ", ".join(f"{setting_named_in(k, f)}={v}" for k, v in f["settings"].items())
        or "none of its settings are yours (made by what iterates it)"
    ),
    "count": lambda f: str(f["count"]),
    "samples-per-step": lambda f: (
        f"{f['count']} a step ({f['batches']} batches of {f['batch_size']} between two optimizer "
        "steps: gradient accumulation)"
    ),
    "no-workers": lambda f: (
        f"no worker processes ({setting_named_in('num_workers', f)}=0): the main "
        "process loads the data"
    ),
    "worker-cpu": lambda f: (
        f"median {fmt_pct(f['pct'])}"
        + (f" across {plural(f['workers'], 'worker')}" if f.get("workers") is not None else "")
        + " (100% = one core)"
    ),
    "process-cpu": lambda f: f"median {fmt_pct(f['pct'])} (100% = one core)",
    "system-cpu": lambda f: (
        f"median {fmt_pct(f['pct'])} of all CPUs"
        + (
            f" (busiest core {fmt_pct(f['busiest_core_pct'])})"
            if f.get("busiest_core_pct") is not None
            else ""
        )
    ),
    "sm-clock": lambda f: (
        f"median {f['mhz']:.0f} of {f['max_mhz']:.0f} MHz ({fmt_share(f['ratio'])})"
    ),
    "no-throttling": lambda f: "none during the steady steps",
    "throttled-steps": lambda f: (
        f"{fmt_share(f['share'])} of the steps ({_reasons(f['reasons'], 'clock below its maximum')})"
        + (f", {f['slowdown']:.2f}\u00d7 as long as the others" if f.get("slowdown") else "")
    ),
    "gpu-memory": lambda f: (
        f"peak {fmt_mb(f['peak_mb'])} of {fmt_mb(f['total_mb'])} ({fmt_share(f['share'])})"
    ),
}
