"""The verdict on a run: the rules, in the order they are tried (docs/diagnosis.md explains them).

1. ``insufficient-data``: fewer than ``MIN_STEADY_STEPS`` steady steps, or nothing that tells
   input waits from compute (no DataLoader, no GPU utilisation, and on a CPU no model phases
   of ``MODEL_BOUND_SHARE`` of the step).
2. ``input-bound``: input stall share ≥ ``INPUT_BOUND_SHARE`` and ≥ ``MIN_INPUT_WAIT_MS`` per
   step, with a sub-cause and the loader changes that address it (:mod:`.input_bound`).
3. ``throttled``: steps during reduced-clock samples clearly slower than the others.
4. ``host-bound``: a GPU run whose GPU is not busy: GPM SM activity below
   ``SM_ACTIVE_BUSY_PCT`` where the GPU has it, else NVML utilisation below ``GPU_BUSY_PCT``
   (:mod:`.gpu_busy`; the title names the signal that decided).
5. ``memory-pressure``: peak GPU memory ≥ ``MEMORY_PRESSURE_SHARE`` of the device.
6. ``compute-bound``: none of the above: the GPU (or, CPU-only, the CPU) is busy computing.

Findings of a later rule that also hold are listed in ``Diagnosis.secondary``. Every statement
is a :class:`~.findings.Finding` (a code and its facts); the views write the sentences
(:mod:`traceml_nb.views.diagnosis_words`).
"""

from __future__ import annotations

from typing import Any

from ..engine.capabilities import Capabilities
from .advice import OWN_BATCHES
from .anatomy_advice import anatomy_advice
from .diagnosis_facts import Facts, confidence
from .evidence import collect, input_signal, memory_share
from .findings import Diagnosis, Finding, Summary
from .gpu_busy import BusySignal, nvml_overstates
from .input_bound import input_bound
from .summary import Measurements
from .thresholds import (
    EVAL_RESTART_MIN_PASSES,
    EVAL_RESTART_RUN_SHARE,
    INPUT_BOUND_SHARE,
    INPUT_MINOR_SHARE,
    MIN_INPUT_WAIT_MS,
    MIN_STEADY_STEPS,
    MODEL_BOUND_SHARE,
    SMALL_BATCH,
    THROTTLE_CLOCK_RATIO,
)
from .throttle import find_throttling

#: The verdicts whose advice the anatomy of the step adds to (:mod:`.anatomy_advice`): where
#: the input is the limit, its own advice comes first and alone.
ANATOMY_VERDICTS = ("compute-bound", "host-bound", "memory-pressure", "throttled")

#: The advice for steps that spend a large share making tiny batches (``Facts.tiny_steps``):
#: make each batch in one call (a dataset's ``__getitems__``, or slicing the tensors), in the
#: training process where workers hand over batches already in memory (``workers`` in its
#: facts).
BATCHED_INDEXING = "batched-indexing"
#: ...where a framework's own loader makes the batches (``advice.OWN_BATCHES``): larger ones
LARGER_BATCHES = "larger-batches"


def diagnose(summary: Summary, m: Measurements, capabilities: Capabilities) -> Diagnosis:
    """The verdict on a run from its summary and measurements."""
    signal = input_signal(summary, m)
    throttle = find_throttling(m.gpu, m.start_s, m.wall_ms) if m.gpu_in_use else None
    facts = Facts(summary, m, signal, throttle, memory_share(summary))
    evidence = collect(summary, m, signal, throttle)
    diagnosis = _verdict(facts)
    diagnosis.evidence = evidence
    if diagnosis.verdict in ANATOMY_VERDICTS:
        diagnosis.advice += anatomy_advice(summary, m.loader, m.gpu_in_use, m.optimizers)
    diagnosis.secondary = _secondary(facts, diagnosis.verdict) + diagnosis.secondary
    if summary.interleaved_steps:
        diagnosis.secondary.append(
            Finding("evaluation-steps-left-out", {"steps": summary.interleaved_steps})
        )
    if summary.profiled_steps:
        diagnosis.secondary.append(
            Finding("profiled-steps-left-out", {"steps": summary.profiled_steps})
        )
    if not m.gpu_in_use:
        why = capabilities.why("gpu_events") or "no GPU in this run"
        diagnosis.secondary.append(Finding("no-gpu-evidence", {"why": why}))
    return diagnosis


def _verdict(f: Facts) -> Diagnosis:
    if f.m.steady < MIN_STEADY_STEPS:
        return _insufficient(f)
    if f.input_bound:
        return input_bound(f)
    if f.signal.kind is None and not f.gpu and _model_share(f) >= MODEL_BOUND_SHARE:
        return _compute_bound_by_phases(f)
    if f.signal.kind is None and (not f.gpu or f.busy is None):
        return Diagnosis(
            verdict="insufficient-data",
            title=Finding("no-input-or-gpu-signal"),
            confidence="low",
            advice=[Finding("iterate-a-loader")],
        )
    if f.throttled:
        return _throttled(f)
    busy = f.busy
    if f.gpu and busy is not None and not busy.busy:
        return _host_bound(f)
    if f.memory_pressure:
        return _memory_pressure(f)
    return _compute_bound(f)


def _insufficient(f: Facts) -> Diagnosis:
    s = f.summary
    if s.total_steps == 0:
        title = Finding("no-steps")
    else:
        title = Finding(
            "too-few-steady-steps",
            {
                "steady_steps": s.steady_steps,
                "needed_steps": MIN_STEADY_STEPS,
                "warmup_steps": s.warmup_steps,
            },
        )
    return Diagnosis(verdict="insufficient-data", title=title, confidence="low")


# --- the other verdicts -------------------------------------------------------------------------
def _input_facts(f: Facts) -> dict[str, Any]:
    """What a verdict other than input-bound says of the input: its share of the step (None:
    unavailable, with why), whether it is the cost of making tiny batches."""
    sig = f.signal
    return {"input_share": sig.share, "input_why": sig.why, "tiny_steps": f.tiny_steps}


def _busy_facts(busy: BusySignal) -> dict[str, Any]:
    """The GPU's busy signal: ``busy_source`` "gpm" (SM activity) or "nvml" (utilisation) and
    its median, percent."""
    return {"busy_source": busy.source, "busy_pct": busy.value_pct}


def _wont_help_input(f: Facts) -> list[Finding]:
    sig = f.signal
    if sig.share is None:
        return []
    if f.tiny_steps:
        return [Finding("more-workers-for-tiny-batches", {"per_step_ms": sig.per_step_ms})]
    if sig.share >= INPUT_BOUND_SHARE:
        return []
    return [Finding("loader-tuning-minor", {"input_kind": sig.kind, "input_share": sig.share})]


def _throttled(f: Facts) -> Diagnosis:
    t = f.throttle
    assert t is not None and t.slowdown is not None
    return Diagnosis(
        verdict="throttled",
        title=Finding("throttled", {"slowdown": t.slowdown, "reasons": list(t.reasons)}),
        confidence=confidence(bool(t.reasons) and t.clock_ratio_median is not None, f.m.steady),
        advice=[Finding("check-cooling-and-power")],
        wont_help=_wont_help_input(f),
        saving_bound_share=t.excess_share,
        saving=Finding(
            "throttle-saving", {"throttled_share": t.share, "excess_share": t.excess_share}
        ),
    )


def _host_bound(f: Facts) -> Diagnosis:
    s, m = f.summary, f.m
    sig = f.busy
    assert sig is not None
    advice = [Finding("remove-host-syncs")]
    if s.batch_size is not None and s.batch_size < SMALL_BATCH:
        advice.append(
            Finding("larger-batch", {"batch_size": s.batch_size, "suggested": s.batch_size * 4})
        )
    advice.append(Finding("cut-launch-overhead"))
    idle = sig.idle_share
    share = f.signal.share
    strong = sig.strong and (share is None or share < INPUT_MINOR_SHARE)
    overstated = nvml_overstates(s, sig)
    return Diagnosis(
        verdict="host-bound",
        title=Finding("host-bound", {**_input_facts(f), **_busy_facts(sig)}),
        confidence=confidence(strong, m.steady, weaker=int(f.signal.kind != "gpu")),
        advice=advice,
        wont_help=_wont_help_input(f),
        saving_bound_share=idle,
        saving=Finding("host-idle-saving", {"busy_source": sig.source, "idle_share": idle}),
        secondary=[overstated] if overstated else [],
    )


def _memory_pressure(f: Facts) -> Diagnosis:
    share = f.memory_share
    assert share is not None
    return Diagnosis(
        verdict="memory-pressure",
        title=Finding(
            "memory-pressure", {"peak_share": share, "total_mb": f.summary.gpu_mem_total_mb}
        ),
        confidence="high",
        advice=[Finding("free-gpu-memory")],
        wont_help=_wont_help_input(f),
    )


def _model_share(f: Facts) -> float:
    """The share of the steps' time the model's timed phases took (0 where not timed)."""
    shares = f.summary.phase_shares
    return sum(shares.get(p, 0.0) for p in ("forward", "backward", "optimizer"))


def _compute_bound_by_phases(f: Facts) -> Diagnosis:
    """A CPU run without a DataLoader whose model phases take nearly all of each step."""
    share = _model_share(f)
    return Diagnosis(
        verdict="compute-bound",
        title=Finding("compute-bound-model-phases", {"model_share": share}),
        confidence=confidence(False, f.m.steady),
        advice=[Finding("cpu-is-the-limit")],
    )


def _compute_bound(f: Facts) -> Diagnosis:
    m, sig = f.m, f.signal
    share = sig.share
    quiet = share is not None and share < INPUT_MINOR_SHARE
    busy = f.busy
    if f.gpu and busy is not None:
        title = Finding("compute-bound-gpu", {**_input_facts(f), **_busy_facts(busy)})
        advice = [Finding("gpu-is-the-limit")]
        conf = confidence(quiet, m.steady, weaker=int(sig.kind != "gpu"))
    elif f.gpu:
        why = f.summary.unavailable.get("gpu_util_median_pct", "not measured")
        title = Finding("gpu-busy-unknown", {**_input_facts(f), "busy_why": why})
        advice = []
        conf = "low"
    elif f.tiny_steps:
        workers = f.workers
        title = Finding(
            "compute-bound-tiny-steps",
            {"step_ms": f.summary.step_ms_median, "input_share": sig.share, "workers": workers},
        )
        # no workers for batches in memory; a dataset that decodes keeps its workers
        in_memory_workers = workers and f.in_memory
        driver = f.m.loader.driver if f.m.loader is not None else None
        if driver in OWN_BATCHES:  # (the batches are made by the framework's loader, not ours)
            advice = [Finding(LARGER_BATCHES, {"driver": driver})]
        else:
            advice = [Finding(BATCHED_INDEXING, {"workers": workers} if in_memory_workers else {})]
        conf = confidence(False, m.steady)
    else:
        title = Finding("compute-bound-cpu", _input_facts(f))
        advice = [Finding("cpu-is-the-limit")]
        conf = confidence(quiet, m.steady)
    return Diagnosis(
        verdict="compute-bound",
        title=title,
        confidence=conf,
        advice=advice,
        wont_help=_wont_help_input(f),
    )


# --- secondary findings -----------------------------------------------------------------------
def _stalls(f: Facts) -> Finding:
    """The fetches that stalled, and at most how much shorter the run would be without them."""
    stalls = f.signal.stalls
    elapsed = f.m.elapsed_s
    share = None
    if elapsed > 0:
        share = min(1.0, sum(s.wait_ms for s in stalls) / 1e3 / elapsed)
    return Finding(
        "stalls",
        {"stalls": [{"step": s.step, "wait_ms": s.wait_ms} for s in stalls], "run_share": share},
    )


def _evaluation_restarts(f: Facts) -> list[Finding]:
    """The evaluations whose loaders started their workers again for each pass, where the
    passes' first batches waited a material share of the run."""
    elapsed = f.m.elapsed_s
    out: list[Finding] = []
    if elapsed <= 0:
        return out
    for phase in f.summary.phases:
        if phase.workers <= 0 or phase.persistent_workers:
            continue
        share = phase.pass_start_wait_s / elapsed
        if phase.passes >= EVAL_RESTART_MIN_PASSES and share >= EVAL_RESTART_RUN_SHARE:
            facts = {
                "phase": phase.name,
                "workers": phase.workers,
                "passes": phase.passes,
                "wait_s": phase.pass_start_wait_s,
                "run_share": share,
                "driver": phase.driver,
                "trains": phase.trains,
                "loaders": phase.loaders,
            }
            out.append(Finding("evaluation-restarts-workers", facts))
    return out


def _secondary(f: Facts, verdict: str) -> list[Finding]:
    out: list[Finding] = []
    if verdict == "insufficient-data":
        return out
    sig = f.signal
    if sig.stalls:
        out.append(_stalls(f))
    out += _evaluation_restarts(f)
    if verdict != "input-bound" and sig.share is not None and sig.per_step_ms is not None:
        if f.tiny_steps:
            out.append(
                Finding(
                    "input-of-tiny-steps",
                    {
                        "input_kind": sig.kind,
                        "input_share": sig.share,
                        "per_step_ms": sig.per_step_ms,
                        "floor_ms": MIN_INPUT_WAIT_MS,
                        "workers": f.workers,
                    },
                )
            )
        elif sig.share >= INPUT_MINOR_SHARE:
            out.append(
                Finding(
                    "minor-input-stalls",
                    {
                        "input_kind": sig.kind,
                        "input_share": sig.share,
                        "bound_share": INPUT_BOUND_SHARE,
                    },
                )
            )
    if verdict != "throttled" and f.throttle is not None:
        t = f.throttle
        if t.aligned and t.slowdown is not None:
            out.append(
                Finding(
                    "throttling",
                    {
                        "throttled_share": t.share,
                        "reasons": list(t.reasons),
                        "slowdown": t.slowdown,
                    },
                )
            )
        elif t.clock_ratio_median is not None and t.clock_ratio_median < THROTTLE_CLOCK_RATIO:
            out.append(
                Finding(
                    "reduced-clock",
                    {"clock_ratio": t.clock_ratio_median, "reasons": list(t.reasons_whole_window)},
                )
            )
    if verdict != "memory-pressure" and f.memory_pressure:
        out.append(
            Finding(
                "memory-pressure-too",
                {"peak_share": f.memory_share, "total_mb": f.summary.gpu_mem_total_mb},
            )
        )
    return out
