"""The report's profile section (``--profile``) as rows and sentences, for the text and the HTML
renderers alike."""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.formatting import fmt_ms
from ..analysis.profile_summary import OpLine, ProfileSummary


@dataclass(frozen=True)
class OpRow:
    """One row of an operator table, as shown."""

    name: str
    share: str  #: "41%"
    per_step: str  #: "2.10 ms"
    calls: str  #: calls per step
    where: str  #: "line 7: out = model(x)" or the user frame, or ""


def heading(profile: ProfileSummary) -> str:
    """``Profile: 10 steps of 9.1 ms, torch.profiler`` or why there is none."""
    if not profile.captured:
        return f"Profile: unavailable: {profile.why}"
    n = profile.steps
    text = f"Profile: {n} step{'s' if n != 1 else ''} of {fmt_ms(profile.step_ms)} under torch.profiler"
    if profile.steps < profile.requested:
        text += f" ({profile.requested} asked for)"
    return text


def _where(op: OpLine) -> str:
    """``line 17: loss = loss_fn(model(x), y)``, with the innermost line when it is another
    (``; line 6 in forward``)."""
    if op.line is None:
        return op.frame or ""
    where = f"line {op.line}" + (f": {op.code}" if op.code else "")
    if op.frame and op.frame != f"line {op.line}":
        where += f"; {op.frame}"
    return where


def op_tables(profile: ProfileSummary) -> list[tuple[str, list[OpRow]]]:
    """The operator tables to show, titled: by host time, and by GPU time on a GPU."""
    tables = [("by host time", op_rows(profile.top_cpu)), ("by GPU time", op_rows(profile.top_gpu))]
    return [(title, rows) for title, rows in tables if rows]


def op_rows(ops: list[OpLine]) -> list[OpRow]:
    return [
        OpRow(
            op.name,
            f"{op.share:.0%}",
            fmt_ms(op.ms_per_step),
            f"{op.calls_per_step:,.4g}",
            _where(op),
        )
        for op in ops
    ]


def facts(profile: ProfileSummary) -> list[str]:
    """The sentences below the tables: waits for the GPU, its idle gaps, the data loading as
    the profiler saw it beside our own timing, the trace file, what is partial."""
    if not profile.captured:
        return []
    out = []
    if profile.syncs:
        for sync in profile.syncs[:3]:
            where = f"line {sync.line}" + (f" (`{sync.code}`)" if sync.code else "")
            out.append(
                f"waits for the GPU: {sync.op} at {where if sync.line else 'an unknown line'}: "
                f"{fmt_ms(sync.ms_per_step)} a step ({sync.share:.0%}), "
                f"{sync.calls_per_step:,.3g} calls a step"
            )
    elif "CPU only" not in profile.gpu_idle_why:
        out.append("waits for the GPU: none seen in the profiled steps")
    if profile.gpu_idle_share is not None:
        out.append(f"GPU idle between kernels: {profile.gpu_idle_share:.0%} of the profiled time")
    else:
        out.append(f"GPU idle between kernels: unavailable: {profile.gpu_idle_why}")
    if profile.loader_share_profiler is not None:
        ours = (
            f", {profile.loader_share_steps:.0%} by the step timing"
            if profile.loader_share_steps is not None
            else ""
        )
        out.append(
            f"data loading: {profile.loader_share_profiler:.0%} of the profiled time by the "
            f"profiler{ours}"
        )
    if profile.trace_path:
        size = f", {profile.trace_bytes / 1e6:.2g} MB" if profile.trace_bytes else ""
        out.append(
            f"trace: {profile.trace_path}{size} (Chrome trace: open it in Perfetto or TensorBoard)"
        )
    if profile.why:
        out.append(f"partial: {profile.why}")
    return out
