"""What a profiled window (``--profile``) names, in words
(:mod:`traceml_nb.analysis.profile_summary` states it): one sentence for each of its codes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..analysis.formatting import fmt_ms

Facts = dict[str, Any]


def _op_where(op: Facts) -> str:
    """``line 17 (`loss = ...`)``, or '' where the profile found no cell line."""
    if op.get("line") is None:
        return ""
    return f"line {op['line']} (`{op['code']}`)" if op.get("code") else f"line {op['line']}"


def _profile_sync(f: Facts) -> str:
    sync = f["sync"]
    every = "every step" if sync["calls_per_step"] >= 1 else "in some steps"
    who = _op_where(sync) or f"`{sync['op']}`"
    return (
        f"{who} waits for the GPU {every}: {fmt_ms(sync['ms_per_step'])} of "
        f"{fmt_ms(f['step_ms'])} a step ({sync['op']})"
    )


def _profile_launch_bound(f: Facts) -> str:
    top = f.get("top")
    lead = ""
    if top:
        where = f", {_op_where(top)}" if top.get("line") else ""
        lead = f"; the host's top operator is `{top['name']}` ({top['share']:.0%}{where})"
    return (
        f"the GPU ran no kernel {f['idle_share']:.0%} of the profiled time: the host "
        f"does not launch work fast enough{lead}"
    )


def _profile_top_op(f: Facts) -> str:
    op = f["op"]
    where = _op_where(op)
    per_step = f"{fmt_ms(op['ms_per_step'])} of {fmt_ms(f['step_ms'])} a step"
    frame = op.get("frame")
    inner = f" ({frame})" if frame and frame != f"line {op.get('line')}" else ""
    if op.get("python"):
        return (
            f"the Python code of {where or op['name']}{inner} takes {op['share']:.0%} of the "
            f"profiled steps' host time outside PyTorch's operators ({per_step}), the Python "
            "functions it calls included"
        )
    called = f", called from {where}{inner}" if where else ""
    return (
        f"`{op['name']}` takes {op['share']:.0%} of the profiled steps' host time "
        f"({per_step}, {op['calls_per_step']:,.0f} calls){called}"
    )


PROFILE_SENTENCES: dict[str, Callable[[Facts], str]] = {
    "profile-sync": _profile_sync,
    "profile-launch-bound": _profile_launch_bound,
    "profile-top-op": _profile_top_op,
}
