"""The FLOPs of one training step, counted once per run with
``torch.utils.flop_counter.FlopCounterMode`` over one whole step (:class:`~.whole_step.WholeStep`:
from the end of an optimizer step to the same optimizer's next end, or where another optimizer
stepped in between, a GAN's, to the one after), after :data:`COUNT_AFTER_STEPS` optimizer steps (past the first steps' one-off work). The
counting slows the step it counts (every operator goes through a Python dispatch mode), so the
step it covers for the most part is left out of the statistics, as profiled steps are
(:attr:`~traceml_nb.engine.flop_capture.FlopCount.window_ns`).

Not counted, with why: a loop without an optimizer step (no step to count), a process that has
compiled a model with ``torch.compile`` (counting would make it compile again), a torch without
the FLOP counter, a run that ended during the counted step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..flop_capture import COMPILED, ENDED, FlopCount
from .whole_step import WholeStep

#: Optimizer steps before the counted one: the second step is counted (the first does one-off
#: work; a count later would take a step from a short run's statistics that the warm-up does
#: not already take).
COUNT_AFTER_STEPS = 1


def _compiled_anything() -> bool:
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return False
    return bool(counters["stats"].get("unique_graphs"))


class FlopWindow:
    """Counts the FLOPs of one step; the tracer's optimizer post-step hook calls
    :meth:`optimizer_step_ended` when :attr:`countdown` runs out. :meth:`close` at the run's
    end gives the :class:`FlopCount`."""

    def __init__(self, clock: Callable[[], int], t0_ns: int) -> None:
        self.clock = clock
        self.t0_ns = t0_ns
        self.countdown = COUNT_AFTER_STEPS
        self.result: FlopCount | None = None
        self._mode: Any = None
        self._start_ns = 0
        self._step: WholeStep | None = None  #: the step counted, while it is

    def optimizer_step_ended(self, optimizer: Any) -> None:
        self.countdown = 1
        if self.result is not None:
            self.countdown = 1 << 62
        elif self._mode is None:
            self._begin(optimizer)
        elif self._step is not None and self._step.closes_at(optimizer):
            self._end()

    def _begin(self, optimizer: Any) -> None:
        if _compiled_anything():
            self.result = FlopCount(why=COMPILED)
            return
        try:
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False)
            mode.__enter__()
        except Exception as exc:
            self.result = FlopCount(why=f"the FLOP counter could not start ({exc!r})")
            return
        self._mode, self._step = mode, WholeStep(optimizer)
        self._start_ns = self.clock()

    def _end(self) -> None:
        mode, self._mode = self._mode, None
        end_ns = self.clock()
        try:
            mode.__exit__(None, None, None)
            flops = int(mode.get_total_flops())
        except Exception as exc:
            self.result = FlopCount(why=f"the FLOP counter failed ({exc!r})")
            return
        window = (self._start_ns - self.t0_ns, end_ns - self.t0_ns)
        self.result = FlopCount(flops, window, "")
        self.countdown = 1 << 62

    def close(self) -> FlopCount:
        """The count (a count under way is given up: the run ended inside it)."""
        if self._mode is not None:
            mode, self._mode = self._mode, None
            try:
                mode.__exit__(None, None, None)
            except Exception:
                pass
            self.result = FlopCount(why=ENDED, window_ns=(self._start_ns - self.t0_ns, 1 << 62))
        return self.result or FlopCount()
