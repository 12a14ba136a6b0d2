"""A window over one whole training step, opened at an optimizer step's end: the phase
instruments' samples (:mod:`.step_phases`) and the FLOP count (:mod:`.flop_count`) each hold
one, told of every optimizer step's end by the tracer's hook."""

from __future__ import annotations

import weakref
from typing import Any


class WholeStep:
    """Opened at the end of ``opened_by``'s step, it closes at that optimizer's next end; where
    another optimizer stepped in between (a GAN's two), at the one after, so that a whole step
    falls inside wherever that optimizer's step comes in it. ``opened_by`` None: it closes at
    the first end. The optimizer is held weakly (it holds the model's parameters and their
    state, which the user's code may let go mid-window, a sweep's stage ending): once it is
    freed, the window closes at the next end."""

    def __init__(self, opened_by: Any = None) -> None:
        self._opened_by: Any = None
        if opened_by is not None:
            try:
                self._opened_by = weakref.ref(opened_by)
            except TypeError:  # no weak references: held
                self._opened_by = lambda: opened_by
        self._others = False  #: another optimizer has stepped since it opened
        self._cycles = 0  #: times ``opened_by`` stepped again since, with others

    @property
    def opened_by(self) -> Any:
        """The optimizer it was opened by (None: none, or freed since)."""
        return self._opened_by() if self._opened_by is not None else None

    def closes_at(self, optimizer: Any) -> bool:
        """``optimizer``'s step has ended: whether the window closes here."""
        opened_by = self.opened_by
        if opened_by is None:
            return True
        if optimizer is not opened_by:
            self._others = True
            return False
        if not self._others or self._cycles:
            return True
        self._cycles += 1
        return False
