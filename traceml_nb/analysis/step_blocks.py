"""The steps of a loader with workers, taken in blocks: whole rounds of its workers.

torch's DataLoader hands over its workers' batches in turn (worker 0's, worker 1's, …). Where
the workers keep up, every step is the compute's; where they cannot, the batches of a round
arrive close together, so a round is one long wait and fast steps: with 3 workers, steps of
0.4, 0.4 and 34 ms, whose median (0.4 ms) is no typical step and whose mean (11.5 ms) is the
pace of the run. A block of consecutive steps that is a whole number of rounds averages that
pattern out; the median over blocks still leaves out a block a stall or a busy moment slowed.

With fewer than two workers there are no rounds: a block is one step, and the statistics are
the steps' own (the median step, as before)."""

from __future__ import annotations

import numpy as np

from .thresholds import MIN_STEP_BLOCKS, STEP_BLOCK_STEPS


def block_steps(workers: int, steps: int) -> int:
    """Steps per block for a loader of ``workers`` workers over ``steps`` steady steps: 1 below
    two workers, else a multiple of ``workers`` of at least ``STEP_BLOCK_STEPS``, made shorter
    (by whole rounds, to one round) until the steps make ``MIN_STEP_BLOCKS`` blocks."""
    if workers < 2:
        return 1
    block = workers * -(-STEP_BLOCK_STEPS // workers)
    while block > workers and steps // block < MIN_STEP_BLOCKS:
        block -= workers
    return block


def block_means(values: np.ndarray, block: int) -> np.ndarray:
    """The means of consecutive blocks of ``block`` values (a last, partial block left out,
    unless it is all there is); the values themselves where ``block`` is 1."""
    values = np.asarray(values, dtype=float)
    if block <= 1 or not len(values):
        return values
    whole = len(values) // block
    if not whole:
        return np.array([values.mean()])
    return values[: whole * block].reshape(whole, block).mean(axis=1)
