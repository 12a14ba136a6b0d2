"""What a run is told: how to measure and conclude (:class:`RunOptions`), and what stands in
for the hardware (:class:`Backends`). Plain data, read by :class:`~.run.Run`, its session and
the magic that parses them from the ``%%traceml`` line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from os import PathLike
from typing import Any

from .events import EventLike


@dataclass(frozen=True)
class Backends:
    """What a run talks to at the hardware boundary, replaced only there (tests, fakes of NVML
    and CUDA events): ``nvml`` an NVML module (None: ``pynvml``); ``event_factory`` and
    ``stream_getter`` the CUDA event class and the current stream (None: on a CUDA device,
    torch's own)."""

    nvml: Any = None
    event_factory: Callable[[], EventLike] | None = None
    stream_getter: Callable[[], Any] | None = None


@dataclass(frozen=True)
class RunOptions:
    """How a run is measured and concluded: one object from the ``%%traceml`` line through
    :class:`Run`, its session's conclusion and the trackers' export.

    Measuring (the engine): ``interval`` the sampler period, s (0.02–1.0); ``device``
    ``None``/``'auto'``, ``'cpu'``, ``'cuda'``, ``'cuda:N'``; ``sample`` run the background
    samplers; ``profile`` steady steps to profile with ``torch.profiler`` (None: none) after
    ``profile_after`` steps, the trace into ``profile_dir``. Concluding (the session):
    ``warmup`` ``"auto"`` or the leading steps left out of the statistics; ``compare`` with the
    earlier runs; ``store`` a path, ``False`` (not stored) or None (the session's); ``log_to``
    the experiment trackers (``"wandb,mlflow,tensorboard:DIR"``; None: the session's, else
    ``TRACEML_NB_LOG_TO``; ``False``/``"off"``: none), ``log_steps`` with the per-step series
    (None: the session's)."""

    interval: float = 0.1
    device: str | int | None = None
    sample: bool = True
    profile: int | None = None
    profile_after: int | None = None
    profile_dir: str | None = None
    warmup: str | int = "auto"
    compare: bool = True
    store: str | PathLike[str] | bool | None = None
    log_to: str | list[str] | bool | None = None
    log_steps: bool | None = None
