"""When the phase instruments (:mod:`.step_phases`, which holds the constants) time a step: the
first one, then one in about every so much training time, told in optimizer steps from the
steps' pace since the last sample."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SampleSchedule:
    """One step in about every ``early_interval_ns`` of training until ``early_samples`` were
    taken, then one in every ``interval_ns`` and ``min_skip`` optimizer steps at least;
    ``first_skip`` steps after the first sample, before the steps' pace is known. Times are
    the tracer's clock, ns."""

    interval_ns: int
    early_interval_ns: int
    min_skip: int
    first_skip: int
    early_samples: int
    samples: int = 0  #: the samples taken (the sampling turned on)
    off_at_ns: int = 0  #: when the sampling last turned off
    skipped: int = 0  #: the optimizer steps it stayed off for since
    on_at_ns: int = 0  #: when it last turned on

    def skip(self, now_ns: int) -> int:
        """The sampling turns off at ``now_ns``: the optimizer steps to stay off for, at the
        pace of the steps skipped last time."""
        skip = self.first_skip
        if self.skipped and self.off_at_ns:
            per_step = (self.on_at_ns - self.off_at_ns) / self.skipped
            early = self.samples < self.early_samples
            interval = self.early_interval_ns if early else self.interval_ns
            least = 1 if early else self.min_skip
            skip = max(least, min(1 << 20, round(interval / max(per_step, 1.0))))
        self.off_at_ns, self.skipped = now_ns, skip
        return skip
