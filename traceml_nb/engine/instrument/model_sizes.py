"""Whether the run changed its model: the parameters of the models each search of the phase
instruments (:mod:`.step_phases`) found. A search again, at the first sample of an optimizer
no sample saw, that finds only models none found before, whose parameters differ in number
from the models found last, means the loop trains another model now (a sweep over model sizes
in one cell): the FLOPs counted on one step are then not the run's (:mod:`.flop_count`). The
same model made again (a fold of a cross-validation) has as many; a GAN's models found in two
searches, the models of the first found again beside them, changed nothing; nor did a model
found by a search after one that found none (first called after the first optimizer step)."""

from __future__ import annotations

from typing import Any


class ModelSizes:
    """The models found in the search under way, and the change, if any: ``changed`` is the
    parameters (numbers of elements) of the models before and after the first change."""

    def __init__(self) -> None:
        self.changed: tuple[int, int] | None = None
        self._sizes: dict[int, int] = {}  #: by id() of a model found, its parameters
        self._found: set[int] = set()  #: in the search under way
        self._earlier: set[int] = set()  #: in the searches before
        self._last = 0  #: the parameters of the models the last search found

    def found(self, model: Any) -> None:
        """A search found ``model`` (an outermost module holding parameters)."""
        key = id(model)
        if key not in self._sizes:
            self._sizes[key] = sum(p.numel() for p in model.parameters())
        self._found.add(key)

    def settled(self, again: bool) -> None:
        """The search is over: the first (``again`` False) or a later one."""
        found, self._found = self._found, set()
        if not found:
            return
        size = sum(self._sizes[key] for key in found)
        earlier = self._earlier
        if again and earlier and not found & earlier and size != self._last and not self.changed:
            self.changed = (self._last, size)
        self._earlier |= found
        self._last = size
