"""The FLOPs of steps whose batches differ in size. The count (one step's,
:mod:`traceml_nb.engine.instrument.flop_count`) stands for every step only where each does the
same work; batches padded to their longest sequence (transformers' ``DataCollatorWithPadding``, a
collate of one's own) do work in proportion to their length. A tiny BERT on SST-2-like lengths at
a batch of 32 did 1.8 to 5.4 GFLOP a step: the count of its second step read 0.59 to 1.39 of the
steps' mean in six runs, 0.83 to 1.12 with batches grouped by length; taken in proportion to the
elements, 0.985 to 1.014 (``DataCollatorWithPadding`` in transformers' Trainer: within 3%,
tests/integration/test_flops_real_models.py).

Where each batch's first tensor was read (:attr:`~traceml_nb.engine.step_table.StepTable`'s
``elements``) and its elements a sample spread by :data:`~.thresholds.VARYING_INPUTS`, the count
is taken in proportion to a batch's elements: the FLOPs per step are the count's per element
times the steps' mean elements, and the FLOP/s the median over the steps of each one's FLOPs over
its time. Attention's work grows with the square of a sequence's length, the rest of a
transformer's in proportion: this understates a long batch's FLOPs by attention's share at most.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .thresholds import VARYING_INPUTS


@dataclass(frozen=True)
class InputSizes:
    """The elements of the batches of the steps a FLOP count stands for: ``counted``, the mean
    of the batches it counted, ``mean`` of all the steps', ``least`` and ``most``."""

    counted: float
    mean: float
    least: int
    most: int

    @property
    def factor(self) -> float:
        """The steps' mean FLOPs over the count's, taken in proportion to the elements."""
        return self.mean / self.counted

    def work(self, flops_counted: float, elements: np.ndarray) -> np.ndarray:
        """The FLOPs of steps of these ``elements``, from the count's per step."""
        return flops_counted * elements / self.counted


def input_sizes(
    counted: np.ndarray, elements: np.ndarray, samples: np.ndarray
) -> InputSizes | None:
    """The :class:`InputSizes` where the steps' batches differ in their samples' size, else
    None: ``counted``, the elements of the batches the count covered; ``elements`` and
    ``samples``, each step's (-1 unknown). None too where any of their elements is unknown.
    The spread is that of the steps of the most common number of samples (the full batches):
    a short last batch holds fewer samples of the same size, and where a trainer fetches
    ahead an epoch's first step holds two fetches' samples and its last none told, while
    their elements are those of the batch each trained on."""
    if not len(counted) or not len(elements) or len(samples) != len(elements):
        return None
    if (counted <= 0).any() or (elements <= 0).any():
        return None
    known = samples[samples > 0]
    if not len(known):
        return None
    values, counts = np.unique(known, return_counts=True)
    full = elements[samples == values[counts.argmax()]]
    if full.std() < VARYING_INPUTS * full.mean():
        return None
    return InputSizes(
        counted=float(counted.mean()),
        mean=float(elements.mean()),
        least=int(elements.min()),
        most=int(elements.max()),
    )
