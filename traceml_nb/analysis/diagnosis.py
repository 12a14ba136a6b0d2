"""The verdict on a run: the rules, in the order they are tried (docs/diagnosis.md explains them).

1. ``insufficient-data``: fewer than ``MIN_STEADY_STEPS`` steady steps, or nothing that tells
   input waits from compute.
2. ``input-bound``: input stall share ≥ ``INPUT_BOUND_SHARE`` and ≥ ``MIN_INPUT_WAIT_MS`` per
   step, with a sub-cause and the loader changes that address it (:mod:`.input_bound`).
3. ``throttled``: steps during reduced-clock samples clearly slower than the others.
4. ``host-bound``: a GPU run whose GPU is not busy: GPM SM activity below
   ``SM_ACTIVE_BUSY_PCT`` where the GPU has it, else NVML utilisation below ``GPU_BUSY_PCT``
   (:mod:`.gpu_busy`; the title names the signal that decided).
5. ``memory-pressure``: peak GPU memory ≥ ``MEMORY_PRESSURE_SHARE`` of the device.
6. ``compute-bound``: none of the above: the GPU (or, CPU-only, the CPU) is busy computing.

Findings of a later rule that also hold are listed in ``Diagnosis.secondary``.
"""

from __future__ import annotations

from ..engine.capabilities import Capabilities
from .diagnosis_facts import Facts, confidence
from .evidence import collect, input_signal, memory_share
from .findings import Diagnosis, Summary
from .formatting import fmt_mb, fmt_ms, fmt_share, fmt_share_below
from .gpu_busy import GPM, nvml_overstates
from .input_bound import input_bound
from .summary import Measurements
from .thresholds import (
    INPUT_BOUND_SHARE,
    INPUT_MINOR_SHARE,
    MIN_INPUT_WAIT_MS,
    MIN_STEADY_STEPS,
    SMALL_BATCH,
    THROTTLE_CLOCK_RATIO,
)
from .throttle import find_throttling


def diagnose(summary: Summary, m: Measurements, capabilities: Capabilities) -> Diagnosis:
    """The verdict on a run from its summary and measurements."""
    signal = input_signal(summary, m)
    throttle = find_throttling(m.gpu, m.start_s, m.wall_ms) if m.gpu_in_use else None
    facts = Facts(summary, m, signal, throttle, memory_share(summary))
    evidence = collect(summary, m, signal, throttle)
    diagnosis = _verdict(facts)
    diagnosis.evidence = evidence
    diagnosis.secondary = _secondary(facts, diagnosis.verdict) + diagnosis.secondary
    if summary.interleaved_steps:
        n = summary.interleaved_steps
        diagnosis.secondary.append(
            f"{n:,} step{'s' if n != 1 else ''} that contained an evaluation "
            f"{'are' if n != 1 else 'is'} left out of the statistics."
        )
    if summary.profiled_steps:
        n = summary.profiled_steps
        diagnosis.secondary.append(
            f"{n:,} step{'s' if n != 1 else ''} that ran under the profiler "
            f"{'are' if n != 1 else 'is'} left out of the statistics."
        )
    if not m.gpu_in_use:
        why = capabilities.why("gpu_events") or "no GPU in this run"
        diagnosis.secondary.append(f"GPU evidence unavailable ({why}): judged on host timings.")
    return diagnosis


def _verdict(f: Facts) -> Diagnosis:
    if f.m.steady < MIN_STEADY_STEPS:
        return _insufficient(f)
    if f.input_bound:
        return input_bound(f)
    if f.signal.kind is None and (not f.gpu or f.busy is None):
        return Diagnosis(
            verdict="insufficient-data",
            title="Cannot judge: no DataLoader was iterated and no GPU utilisation was measured",
            confidence="low",
            advice=["Iterate a torch DataLoader in the cell, or run on a GPU, to get a verdict."],
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
        title = "No training steps seen: no DataLoader batches, optimizer steps or traceml_nb.step() markers"
    else:
        title = (
            f"Not enough steady steps to judge: {s.steady_steps} "
            f"(at least {MIN_STEADY_STEPS} needed after {s.warmup_steps} warm-up)"
        )
    return Diagnosis(verdict="insufficient-data", title=title, confidence="low")


# --- the other verdicts -------------------------------------------------------------------------
def _not_input_text(f: Facts) -> str:
    sig = f.signal
    if sig.share is None:
        return f"input waits unavailable: {sig.why}"
    if f.tiny_steps:
        return f"data loading is {fmt_share(sig.share)} of very short steps"
    return f"input stalls {fmt_share(sig.share)} of step time"


def _wont_help_input(f: Facts) -> list[str]:
    sig = f.signal
    if sig.share is None:
        return []
    if f.tiny_steps:
        return [
            f"More DataLoader workers: at {fmt_ms(sig.per_step_ms)} a batch, handing each batch "
            "over from a worker process costs about as much as making it in the training loop."
        ]
    if sig.share >= INPUT_BOUND_SHARE:
        return []
    return [
        f"DataLoader tuning (workers, pin_memory, prefetch): {sig.label} is only {fmt_share(sig.share)} of step time."
    ]


#: The advice for steps that spend a large share making tiny batches (``Facts.tiny_steps``).
BATCHED_INDEXING = (
    "Make each batch in one call instead of item by item: give the dataset a __getitems__ "
    "(the DataLoader then fetches a whole batch at once), or slice the tensors directly "
    "instead of iterating a DataLoader over a TensorDataset."
)


def _throttled(f: Facts) -> Diagnosis:
    t = f.throttle
    assert t is not None and t.slowdown is not None
    reasons = ", ".join(t.reasons) or "reduced clock"
    return Diagnosis(
        verdict="throttled",
        title=f"Throttled: steps take {t.slowdown:.2f}\u00d7 as long while the GPU clock is reduced ({reasons})",
        confidence=confidence(bool(t.reasons) and t.clock_ratio_median is not None, f.m.steady),
        advice=[
            "The GPU lowers its clock for power or heat: check cooling and the power limit "
            "(nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE). On a shared cloud GPU this is "
            "outside your code."
        ],
        wont_help=_wont_help_input(f),
        saving_bound_share=t.excess_share,
        saving_text=(
            f"The throttled steps ({fmt_share(t.share)} of the steps) cost about "
            f"{fmt_share(t.excess_share)} of the steady time over steps at full clock."
        ),
    )


def _host_bound(f: Facts) -> Diagnosis:
    s, m = f.summary, f.m
    sig = f.busy
    assert sig is not None
    advice = [
        "Remove per-step host syncs: .item(), .cpu(), float(loss), printing tensors; "
        "accumulate metrics on the GPU and read them every N steps.",
    ]
    if s.batch_size is not None and s.batch_size < SMALL_BATCH:
        advice.append(
            f"Batch size {s.batch_size} is small: a larger batch (e.g. {s.batch_size * 4}) gives "
            "the GPU more work per kernel launch."
        )
    advice.append(
        'Cut launch overhead: torch.compile(model), or CUDA graphs via torch.compile(mode="reduce-overhead").'
    )
    idle = sig.idle_share
    share = f.signal.share
    strong = sig.strong and (share is None or share < INPUT_MINOR_SHARE)
    if sig.source == GPM:
        idle_text = f"The SMs were idle about {fmt_share(idle)} of their time"
    else:
        idle_text = f"The GPU was idle about {fmt_share(idle)} of the time"
    overstated = nvml_overstates(s, sig)
    return Diagnosis(
        verdict="host-bound",
        title=(
            f"Host-bound: {_not_input_text(f)}, but {sig.subject} idle much of the time: "
            f"median {sig.text}"
        ),
        confidence=confidence(strong, m.steady, weaker=int(f.signal.kind != "gpu")),
        advice=advice,
        wont_help=_wont_help_input(f),
        saving_bound_share=idle,
        saving_text=f"{idle_text}: removing host overhead saves at most {fmt_share(idle)}.",
        secondary=[overstated] if overstated else [],
    )


def _memory_pressure(f: Facts) -> Diagnosis:
    s = f.summary
    share = f.memory_share
    assert share is not None
    return Diagnosis(
        verdict="memory-pressure",
        title=f"Memory pressure: GPU memory peaked at {fmt_share(share)} of {fmt_mb(s.gpu_mem_total_mb)}",
        confidence="high",
        advice=[
            "No headroom: a larger batch will not fit and the allocator may free and retry. "
            "Free memory with mixed precision (torch.autocast), gradient checkpointing or a "
            "smaller batch; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation.",
        ],
        wont_help=_wont_help_input(f),
    )


def _compute_bound(f: Facts) -> Diagnosis:
    m, sig = f.m, f.signal
    share = sig.share
    quiet = share is not None and share < INPUT_MINOR_SHARE
    busy = f.busy
    if f.gpu and busy is not None:
        title = (
            f"Compute-bound (healthy): {busy.subject} busy, median {busy.text}; "
            f"{_not_input_text(f)}"
        )
        advice = [
            "The GPU is the limit: speed-ups come from the model side (mixed precision with "
            "torch.autocast, channels_last, torch.compile)."
        ]
        conf = confidence(quiet, m.steady, weaker=int(sig.kind != "gpu"))
    elif f.gpu:
        why = f.summary.unavailable.get("gpu_util_median_pct", "not measured")
        title = (
            f"Not input-bound ({_not_input_text(f)}); GPU utilisation unavailable ({why}), "
            "so host- and compute-bound cannot be told apart"
        )
        advice = []
        conf = "low"
    elif f.tiny_steps:
        title = (
            f"Compute-bound: the steps are very short ({fmt_ms(f.summary.step_ms_median)}): "
            f"{fmt_share(sig.share)} of each is making its batch in the training process "
            "(indexing and collating, no input pipeline to wait for), the rest is the model's work"
        )
        advice = [BATCHED_INDEXING]
        conf = confidence(False, m.steady)
    else:
        title = f"Compute-bound: the steps spend their time computing, not waiting for data ({_not_input_text(f)})"
        advice = [
            "The CPU computing the model is the limit: a GPU, or a smaller model or inputs, is what makes it faster."
        ]
        conf = confidence(quiet, m.steady)
    return Diagnosis(
        verdict="compute-bound",
        title=title,
        confidence=conf,
        advice=advice,
        wont_help=_wont_help_input(f),
    )


# --- secondary findings -----------------------------------------------------------------------
def _stalls_sentence(f: Facts) -> str:
    """``One fetch, at step 37, took 1.0 s: a stall, not a slow pipeline; ...``"""
    stalls = f.signal.stalls
    waits = [fmt_ms(s.wait_ms) for s in stalls]
    steps = [str(s.step) for s in stalls]
    if len(stalls) == 1:
        text = f"One fetch, at step {steps[0]}, took {waits[0]}: a stall, not a slow pipeline"
    else:
        listed = f"{', '.join(steps[:-1])} and {steps[-1]}"
        took = f"{', '.join(waits[:-1])} and {waits[-1]}"
        text = f"{len(stalls)} fetches, at steps {listed}, took {took}: stalls, not a slow pipeline"
    elapsed = f.m.elapsed_s
    if elapsed > 0:
        share = min(1.0, sum(s.wait_ms for s in stalls) / 1e3 / elapsed)
        text += f"; without {'it' if len(stalls) == 1 else 'them'} the run would take at most {fmt_share(share)} less time"
    return text + "."


def _secondary(f: Facts, verdict: str) -> list[str]:
    out: list[str] = []
    if verdict == "insufficient-data":
        return out
    sig = f.signal
    if sig.stalls:
        out.append(_stalls_sentence(f))
    if verdict != "input-bound" and sig.share is not None and sig.per_step_ms is not None:
        if f.tiny_steps:
            out.append(
                f"The {sig.label} is {fmt_share(sig.share)} of a very short step "
                f"({fmt_ms(sig.per_step_ms)} per step, below the {fmt_ms(MIN_INPUT_WAIT_MS)} "
                "floor): the cost of indexing and collating each batch, not an input pipeline "
                "that lags."
            )
        elif sig.share >= INPUT_MINOR_SHARE:
            out.append(
                f"Minor input stalls: {sig.label} is {fmt_share_below(sig.share, INPUT_BOUND_SHARE)}"
                f" of step time (input-bound from {fmt_share(INPUT_BOUND_SHARE)})."
            )
    if verdict != "throttled" and f.throttle is not None:
        t = f.throttle
        if t.aligned and t.slowdown is not None:
            out.append(
                f"Throttling: {fmt_share(t.share)} of the steps ran at a reduced clock "
                f"({', '.join(t.reasons) or 'clock below its maximum'}) and took {t.slowdown:.2f}\u00d7 as long."
            )
        elif t.clock_ratio_median is not None and t.clock_ratio_median < THROTTLE_CLOCK_RATIO:
            reasons = ", ".join(t.reasons_whole_window) or "no reason reported"
            out.append(
                f"The SM clock ran at {fmt_share(t.clock_ratio_median)} of its maximum during the "
                f"steady steps ({reasons}); steps would be faster at full clock."
            )
    if verdict != "memory-pressure" and f.memory_pressure:
        assert f.memory_share is not None
        out.append(
            f"Memory pressure: GPU memory peaked at {fmt_share(f.memory_share)} of "
            f"{fmt_mb(f.summary.gpu_mem_total_mb)}; a larger batch will not fit."
        )
    return out
