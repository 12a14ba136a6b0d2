"""TensorBoard: the figures as scalars at the run's last step, the text summary as a text
summary (``traceml/summary``), the per-step series as scalars with the step index as the step
(``--log-steps``), written with PyTorch's ``SummaryWriter``; the report next to the events as
``traceml-report-<name>.html`` (TensorBoard shows no HTML).

``tensorboard:DIR`` writes into DIR itself: point it at your own run's log directory and
TensorBoard shows the figures with that run (it reads every event file of a directory).
Without DIR: a new run directory, ``runs/traceml-<name>-<time>``, as ``SummaryWriter``'s own
default is under ``runs/``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import Target

LABEL = "TensorBoard"
DEFAULT_ROOT = "runs"


def log_dir(target: Target, payload: Any) -> str:
    """Where the events go (see the module's docstring)."""
    if target.path:
        return os.path.expanduser(target.path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(DEFAULT_ROOT, f"traceml-{payload.slug}-{stamp}")


def export(payload: Any, target: Target) -> str:
    from torch.utils.tensorboard import SummaryWriter  # ImportError without tensorboard

    folder = log_dir(target, payload)
    writer = SummaryWriter(log_dir=folder)
    try:
        for name, value in payload.metrics.items():
            writer.add_scalar(name, value, payload.step)
        for name, points in (payload.steps or {}).items():
            for index, value in points:
                writer.add_scalar(name, value, index)
        writer.add_text("traceml/summary", payload.text, payload.step)
    finally:
        writer.close()
    extra = ""
    if payload.html is not None:
        report = os.path.join(folder, f"traceml-report-{payload.slug}.html")
        with open(report, "w", encoding="utf-8") as f:
            f.write(payload.html)
        extra = f", the report as {report}"
    return (
        f"logged to TensorBoard in {folder} (`tensorboard --logdir {folder}`): "
        f"{len(payload.metrics)} scalars, the verdict as text{extra}"
        + (f", {len(payload.steps)} per-step series" if payload.steps else "")
    )
