"""A loop that fetches every batch of a gradient-accumulation cycle before it trains on them
(transformers' Trainer does) has the optimizer steps as its steps, not its fetches, which
would alternate between a bare fetch and the whole cycle's work; a loop that accumulates one
batch at a time keeps a step per batch. Logs of events over a real DataLoader iterator, as
the instruments log them."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from traceml_nb.analysis.steps import select_rows
from traceml_nb.engine import events as ev
from traceml_nb.engine.instrument.tracer import StepTracer
from traceml_nb.engine.open_steps import FETCH_ONLY_SHARE
from traceml_nb.engine.record import RunRecord

CYCLES, ACCUMULATION = 8, 2
WAIT_NS = 100_000  #: each fetch waits 0.1 ms
STEP_WORK_NS = 20_000_000  #: the work of a step with an optimizer step, outside next()


def _record(fetch_ahead: bool, rest_between_fetches_ns: int) -> RunRecord:
    """``CYCLES`` cycles of ``ACCUMULATION`` batches: fetched all at once (``rest_between``
    apart) then trained on, or each trained on as it comes (a micro-step's forward and
    backward, about the step's work, between fetches)."""
    it = iter(DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=2))
    opt = object()
    t, n, log = 1_000, 0, [(ev.EPOCH_STARTED, it, 64, None, True)]
    for _ in range(CYCLES):
        for k in range(ACCUMULATION):
            n += 1
            log.append((ev.FETCH, it, n, t, t + WAIT_NS, 2, None, None))
            t += WAIT_NS
            last = k == ACCUMULATION - 1
            t += rest_between_fetches_ns if fetch_ahead and not last else STEP_WORK_NS
        log.append((ev.OPTIMIZER_STEP, opt, t))
    log.append((ev.EXHAUSTED, it, t + 10, None))
    record = RunRecord()
    tracer = StepTracer(record, clock=lambda: t + 20)
    tracer.log.extend(log)
    tracer.process()
    tracer.close()
    assert tracer.error is None, tracer.error
    return record


@pytest.mark.parametrize(
    ("fetch_ahead", "rest_ns", "ahead"),
    [
        (True, 30_000, True),  # the Trainer: fetches 30 us apart, then 20 ms of work
        (True, int(FETCH_ONLY_SHARE * STEP_WORK_NS), True),  # at the share: still fetch-only
        (True, int(FETCH_ONLY_SHARE * STEP_WORK_NS) + 1_000, False),  # past it: work
        (False, 0, False),  # accumulation one batch at a time
    ],
)
def test_a_cycle_fetched_ahead_makes_the_optimizer_steps_the_steps(fetch_ahead, rest_ns, ahead):
    record = _record(fetch_ahead, rest_ns)
    (info,) = record.loaders
    assert info.fetches_ahead is ahead
    selection = select_rows(record.snapshot())
    if ahead:
        assert info.fetch_only_rows == CYCLES - 1  # the first cycle's is its epoch's first
        assert len(selection.wall_ms) == CYCLES  # one step per optimizer step
        assert (selection.wall_ms[1:] >= STEP_WORK_NS / 1e6).all()
        # each step the samples of its cycle's batches (its throughput, its batch size)
        assert list(selection.batch) == [ACCUMULATION * 2] * CYCLES
    else:
        assert len(selection.wall_ms) == CYCLES * ACCUMULATION  # one step per batch
        assert set(selection.batch) == {2}
