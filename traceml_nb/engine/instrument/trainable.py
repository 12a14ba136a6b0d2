"""Whether the loop changed which parameters it trains once the FLOPs were counted: fastai's
``fine_tune`` trains the head with the body frozen for its first epochs, then the whole model;
a transfer-learning loop unfreezes its backbone (``requires_grad_(True)``). Each step after
does more work than the step counted (a three-block conv net under ``fine_tune``: 3.68 GFLOP a
step frozen, 5.55 after), so :class:`~.flop_count.FlopWindow` counts again."""

from __future__ import annotations

import weakref
from typing import Any

#: Optimizer steps between two looks at the trainable parameters, once a count stood (a look
#: reads ``requires_grad`` of each parameter the optimizer holds: a few microseconds); each
#: epoch's first optimizer step is looked at too (:func:`.hooks.install`).
TRAINABLE_CHECK_STEPS = 32
#: Counts made again in a run at most (fastai's gradual unfreezing changes the trainable
#: parameters three times: ``freeze_to(-2)``, ``freeze_to(-3)``, ``unfreeze()``); a change
#: after those makes the FLOPs unavailable.
MAX_RECOUNTS = 3


class TrainableWatch:
    """The trainable parameter tensors of each optimizer as it stepped, first when the count
    stood, held beside a weak reference to it (an optimizer holds its model). Each is read at
    its own step: a GAN freezes its discriminator for the generator's step only."""

    def __init__(self) -> None:
        self._trainable: dict[int, tuple[Any, int]] = {}

    def note(self, optimizer: Any) -> None:
        """The count stood at the end of ``optimizer``'s step: what it trains now (the other
        optimizers are read at their next look)."""
        self._trainable = {}
        self.changed(optimizer)

    def changed(self, optimizer: Any) -> bool:
        """``optimizer``, whose step just ended, trains other parameter tensors than at its
        first look (a first look changed nothing)."""
        known = self._trainable.get(id(optimizer))
        now = trainable(optimizer)
        if known is not None and known[0]() is optimizer:
            return now != known[1]
        try:
            self._trainable[id(optimizer)] = (weakref.ref(optimizer), now)
        except TypeError:  # no weak references: not watched, rather than kept alive
            pass
        return False


def trainable(optimizer: Any) -> int:
    """The parameter tensors ``optimizer`` holds that require a gradient (-1 unreadable)."""
    try:
        return sum(
            bool(p.requires_grad) for group in optimizer.param_groups for p in group["params"]
        )
    except Exception:
        return -1
