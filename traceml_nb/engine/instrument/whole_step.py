"""A window over one whole training step, opened at an optimizer step's end: the phase
instruments' samples (:mod:`.step_phases`) and the FLOP count (:mod:`.flop_count`) each hold
one, told of every optimizer step's end by the tracer's hook."""

from __future__ import annotations

from typing import Any


class WholeStep:
    """Opened at the end of ``opened_by``'s step, it closes at that optimizer's next end; where
    another optimizer stepped in between (a GAN's two), at the one after, so that a whole step
    falls inside wherever that optimizer's step comes in it. ``opened_by`` None: it closes at
    the first end."""

    def __init__(self, opened_by: Any = None) -> None:
        self.opened_by = opened_by
        self._others = False  #: another optimizer has stepped since it opened
        self._cycles = 0  #: times ``opened_by`` stepped again since, with others

    def closes_at(self, optimizer: Any) -> bool:
        """``optimizer``'s step has ended: whether the window closes here."""
        if self.opened_by is None:
            return True
        if optimizer is not self.opened_by:
            self._others = True
            return False
        if not self._others or self._cycles:
            return True
        self._cycles += 1
        return False
