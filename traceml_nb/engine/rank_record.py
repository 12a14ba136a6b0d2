"""What one rank launched from a run measured, as its rows reached the kernel
(:mod:`.rank_launch` fills it in)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .record import RunRecord


@dataclass
class RankRecord:
    """What one rank launched from the run (``torch.multiprocessing.spawn`` and the like)
    measured in its own process, as its rows reached the kernel.

    ``record`` holds the rank's steps on its own clock (``perf_counter_ns``, relative to its
    own ``t0_ns``); ``status`` is "running" until the rank's last message, then "completed",
    "failed" or "interrupted"; "lost" when its channel closed without one (the rank was killed,
    e.g. by the launcher after another rank failed: its rows until then are kept).
    """

    rank: int  #: the process index the launcher gave the rank (its local rank)
    launch: int = 0  #: which launch of the run it belongs to (0: the first)
    pid: int | None = None
    status: str = "running"
    error: str | None = None  #: "ValueError: boom" for a rank that failed
    record: RunRecord = field(default_factory=RunRecord)
    notes: list[str] = field(default_factory=list)  #: the rank's own capability notes
