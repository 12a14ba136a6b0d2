"""Whether the run changed its model: the parameters of the models each search of the phase
instruments (:mod:`.step_phases`) found. A search again, at the first sample of an optimizer
no sample saw, that finds only models none found before, whose parameters differ in number
from the models found last, means the loop trains another model now (a sweep over model sizes
in one cell): the FLOPs counted on one step are then not the run's (:mod:`.flop_count`). The
same model made again (a fold of a cross-validation) has as many; a GAN's models found in two
searches, the models of the first found again beside them, changed nothing; nor did a model
found by a search after one that found none (first called after the first optimizer step)."""

from __future__ import annotations

import weakref
from typing import Any


class ModelSizes:
    """The models found in the search under way, and the change, if any: ``changed`` is the
    parameters (numbers of elements) of the models before and after the first change. Each
    model is told by a number of its own, held beside a weak reference to it, so that a model
    made where a freed one was (``id()`` reused, a trial run in a function of its own) is a
    new one, and no model is kept alive."""

    def __init__(self) -> None:
        self.changed: tuple[int, int] | None = None
        #: by id() of a model found: a weak reference to it, its number and its parameters
        self._seen: dict[int, tuple[weakref.ref[Any], int, int]] = {}
        self._found: dict[int, int] = {}  #: in the search under way: parameters by number
        self._earlier: set[int] = set()  #: the numbers found in the searches before
        self._last = 0  #: the parameters of the models the last search found
        self._numbered = 0  #: the models numbered so far

    def found(self, model: Any) -> None:
        """A search found ``model`` (an outermost module holding parameters)."""
        seen = self._seen.get(id(model))
        if seen is None or seen[0]() is not model:
            try:
                ref = weakref.ref(model)
            except TypeError:  # (no weak reference: not told, rather than kept alive)
                return
            self._numbered += 1
            seen = (ref, self._numbered, _parameters(model))
            self._seen[id(model)] = seen
        self._found[seen[1]] = seen[2]

    @property
    def found_any(self) -> bool:
        """A search found a model (a module holding parameters, called outermost)."""
        return bool(self._seen)

    def settled(self, again: bool) -> None:
        """The search is over: the first (``again`` False) or a later one."""
        found, self._found = self._found, {}
        if not found:
            return
        size = sum(found.values())
        earlier = self._earlier
        if again and earlier and not found.keys() & earlier and size != self._last:
            self.changed = self.changed or (self._last, size)
        earlier.update(found)
        self._last = size


def _parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
