"""The ``anatomy`` check: a step's phases on the GPU, and the MFU of a loop whose FLOPs are known
by hand.

A stack of ``ANATOMY_LAYERS`` square linear layers (width ``ANATOMY_WIDTH``, batch
``ANATOMY_BATCH``, bf16 where the GPU has it, else fp16) trains under a ``Run`` on the GPU, its
batches drawn by a real ``DataLoader`` over indices into a tensor already on the GPU. Its FLOPs
a step, by hand: each layer's forward is a ``B×W·W×W`` matrix product (``2·B·W²``), its
backward one product for the weights' gradient and, past the first layer (whose input needs no
gradient), one for the input's (``2·B·W²`` each); the biases and the ReLUs are not counted, as
``FlopCounterMode`` does not count them.

Beside the run's own instruments the check records CUDA events of its own on the same stream
every step: before the batch's copy, before and after the forward, before and after the
backward (the loss between them), and after the optimizer's step. Judged (:func:`judge_anatomy`): the run's FLOP count
within ``FLOP_TOLERANCE`` of the hand count; its MFU within ``MFU_TOLERANCE`` (relative) of the
hand MFU (the hand FLOPs over the median step between the check's own events, against the
table's peak for the GPU and dtype); each phase's GPU median over the steps whose phases the run
timed within ``PHASE_TOLERANCE`` (or ``PHASE_SLACK_MS``) of the check's events on those steps.
A GPU not in the table of peaks has its MFU unavailable: the rest is judged.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from .cuda import torch_module
from .results import FAIL, PASS, Budget, CheckResult

ANATOMY_LAYERS = 4
ANATOMY_WIDTH = 4096
ANATOMY_BATCH = 4096
#: Steps whose phases the run must have timed (fewer than EARLY_SAMPLES: it times one step in
#: every EARLY_SAMPLE_INTERVAL_S).
MIN_TIMED_STEPS = 8
FLOP_TOLERANCE = 0.05  #: the run's FLOPs a step against the hand count, relative
MFU_TOLERANCE = 0.10  #: the run's MFU against the hand MFU, relative
PHASE_TOLERANCE = 0.10  #: a phase's GPU median against the check's own events, relative...
PHASE_SLACK_MS = 0.05  #: ...or this close, ms (a phase of a few microseconds)
PHASE_NAMES = ("copy", "forward", "backward", "optimizer")
#: The check's own events of a step, and the two that bound each phase (by PHASE_NAMES).
BOUNDS = ("copy", "forward", "forward end", "backward", "optimizer", "end")
PHASE_BOUNDS = ((0, 1), (1, 2), (3, 4), (4, 5))


def hand_flops(batch: int, width: int, layers: int) -> int:
    """FLOPs a training step of ``layers`` square linear layers makes (see the module)."""
    per_product = 2 * batch * width * width
    return per_product * (3 * layers - 1)


@dataclass
class AnatomyFigures:
    """What the run reported and what the check measured by hand, for :func:`judge_anatomy`."""

    flops: float | None  #: the run's FLOPs a step
    hand_flops: float
    mfu: float | None  #: the run's MFU, 0..1 (None: unavailable)
    hand_mfu: float | None  #: None where the GPU or dtype has no tabled peak
    mfu_why: str = ""
    timed_steps: int = 0  #: steps whose GPU phases the run resolved
    #: each phase's GPU median, ms, by PHASE_NAMES: the run's, and the check's on the same steps
    phases_ms: dict[str, float] = field(default_factory=dict)
    hand_phases_ms: dict[str, float] = field(default_factory=dict)


def judge_anatomy(f: AnatomyFigures) -> list[str]:
    """What is wrong (empty: it passes); see the module for the rules."""
    problems = []
    if f.flops is None or abs(f.flops / f.hand_flops - 1) > FLOP_TOLERANCE:
        counted = "none" if f.flops is None else f"{f.flops:.4g}"
        problems.append(f"FLOPs a step {counted}, by hand {f.hand_flops:.4g}")
    if f.hand_mfu is not None and (f.mfu is None or abs(f.mfu / f.hand_mfu - 1) > MFU_TOLERANCE):
        reported = "unavailable" if f.mfu is None else f"{f.mfu:.1%}"
        problems.append(f"MFU {reported}, by hand {f.hand_mfu:.1%}")
    if f.timed_steps < MIN_TIMED_STEPS:
        problems.append(f"GPU phases on {f.timed_steps} steps (at least {MIN_TIMED_STEPS})")
    for name in PHASE_NAMES:
        got, hand = f.phases_ms.get(name, math.nan), f.hand_phases_ms.get(name, math.nan)
        off = abs(got - hand)
        if not off <= max(PHASE_SLACK_MS, PHASE_TOLERANCE * hand):  # NaN fails too
            problems.append(f"{name} {got:.3f} ms on the GPU, by hand {hand:.3f} ms")
    return problems


def _measure(torch: Any, steps: int) -> tuple[Any, list[list[Any]], str]:
    """Train ``steps`` steps under a run on the GPU: ``(run, events, dtype)``, ``events[k]`` the
    check's own six events of step ``k`` (:data:`BOUNDS`)."""
    from torch.utils.data import DataLoader, TensorDataset

    from ..engine.run import Run

    device = torch.device("cuda", torch.cuda.current_device())
    bf16 = torch.cuda.is_bf16_supported()
    dtype, dtype_name = (torch.bfloat16, "bf16") if bf16 else (torch.float16, "fp16")
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(ANATOMY_LAYERS):
        layers += [torch.nn.Linear(ANATOMY_WIDTH, ANATOMY_WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    data = torch.randn(ANATOMY_BATCH * 8, ANATOMY_WIDTH, device=device, dtype=dtype)
    indices = torch.arange(ANATOMY_BATCH * 8)
    loader = DataLoader(TensorDataset(indices), batch_size=ANATOMY_BATCH, shuffle=True)

    def new() -> Any:
        return torch.cuda.Event(enable_timing=True)

    events = [[new() for _ in BOUNDS] for _ in range(steps)]
    with Run("selfcheck-anatomy", device=device.index, sample=False) as run:
        step = 0
        while step < steps:
            for (idx,) in loader:
                if step == steps:
                    break
                ev = events[step]
                ev[0].record()
                x = data[idx.to(device, non_blocking=True)]
                ev[1].record()
                out = model(x)
                ev[2].record()
                loss = out.float().pow(2).mean()
                ev[3].record()
                loss.backward()
                ev[4].record()
                opt.step()
                ev[5].record()
                opt.zero_grad(set_to_none=True)
                step += 1
    torch.cuda.synchronize()
    return run, events, dtype_name


def check_anatomy(budget: Budget) -> CheckResult:
    torch = torch_module()
    from ..analysis.peak_flops import peak_for
    from ..analysis.pipeline import analyze
    from ..engine.instrument.step_phases import EARLY_SAMPLE_INTERVAL_S
    from ..engine.step_table import GPU_PHASE_COLUMNS

    _, warm, _ = _measure(torch, 6)  # compiles the kernels; times a step
    step_ms = statistics.median(warm[k][0].elapsed_time(warm[k + 1][0]) for k in range(1, 5))
    wanted_s = 3 * MIN_TIMED_STEPS * EARLY_SAMPLE_INTERVAL_S
    steps = max(40, min(5000, math.ceil(wanted_s * 1e3 / max(step_ms, 1e-3))))
    if not budget.allows(steps * step_ms / 1e3 * 1.5 + 5):
        steps = 40
    run, events, dtype = _measure(torch, steps)
    summary = analyze(run.record, run.capabilities, warmup=3).summary
    cols = run.record.steps.snapshot()
    gpu = [cols.phase_column(name) for name in GPU_PHASE_COLUMNS]
    timed = [k for k in range(min(len(cols), steps)) if all(math.isfinite(c[k]) for c in gpu)]
    phases, hand_phases = {}, {}
    for i, (name, (a, b)) in enumerate(zip(PHASE_NAMES, PHASE_BOUNDS, strict=True)):
        if timed:
            phases[name] = statistics.median(gpu[i][k] for k in timed)
            hand_phases[name] = statistics.median(
                events[k][a].elapsed_time(events[k][b]) for k in timed
            )
    flops = hand_flops(ANATOMY_BATCH, ANATOMY_WIDTH, ANATOMY_LAYERS)
    hand_step_s = (
        statistics.median(events[k][0].elapsed_time(events[k + 1][0]) for k in range(3, steps - 1))
        / 1e3
    )
    peak = peak_for(torch.cuda.get_device_name(), dtype)
    hand_mfu = flops / hand_step_s / (peak.tflops * 1e12) if peak.tflops else None
    figures = AnatomyFigures(
        summary.flops_per_step,
        flops,
        summary.mfu,
        hand_mfu,
        peak.why,
        len(timed),
        phases,
        hand_phases,
    )
    problems = judge_anatomy(figures)
    mfu_text = (
        f"MFU {summary.mfu:.1%} (by hand {hand_mfu:.1%}, {dtype})"
        if summary.mfu is not None and hand_mfu is not None
        else f"MFU unavailable ({summary.unavailable.get('mfu') or peak.why})"
    )
    phase_text = ", ".join(
        f"{n} {phases[n]:.3f}/{hand_phases[n]:.3f} ms" for n in PHASE_NAMES if n in phases
    )
    text = (
        f"{steps} steps of {step_ms:.2f} ms; FLOPs a step {summary.flops_per_step or 0:.4g} "
        f"(by hand {flops:.4g}); {mfu_text}; GPU phases on {len(timed)} steps, run/hand: "
        f"{phase_text}"
    )
    details = {**figures.__dict__, "steps": steps, "step_ms": step_ms, "dtype": dtype}
    if problems:
        return CheckResult("anatomy", FAIL, "; ".join(problems) + " — " + text, details)
    return CheckResult("anatomy", PASS, text, details)
