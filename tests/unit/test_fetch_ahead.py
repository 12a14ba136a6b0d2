"""A loop that fetches every batch of a gradient-accumulation cycle before it trains on them
(transformers' Trainer does) has the optimizer steps as its steps, not its fetches, which
would alternate between a bare fetch and the whole cycle's work; a loop that accumulates one
batch at a time keeps a step per batch. Logs of events over a real DataLoader iterator, as
the instruments log them; and a loop whose optimizer skipped a step (GradScaler does, on
gradients that overflowed) is neither."""

from __future__ import annotations

import pytest
import torch
from support.builders import processed
from torch.utils.data import DataLoader, TensorDataset

from traceml_nb.analysis.steps import select_rows
from traceml_nb.engine import events as ev
from traceml_nb.engine.open_steps import FETCH_ONLY_SHARE, STEPS_TO_TELL_ROWS
from traceml_nb.engine.record import RunRecord

CYCLES, ACCUMULATION = 8, 2
WAIT_NS = 100_000  #: each fetch waits 0.1 ms
STEP_WORK_NS = 20_000_000  #: the work of a step with an optimizer step, outside next()


def _record(fetch_ahead: bool, rest_between_fetches_ns: int, evaluated: bool = False) -> RunRecord:
    """``CYCLES`` cycles of ``ACCUMULATION`` batches: fetched all at once (``rest_between``
    apart) then trained on, or each trained on as it comes (a micro-step's forward and
    backward, about the step's work, between fetches); and, if ``evaluated``, an epoch of the
    same loader under ``torch.no_grad()`` (each batch's forward about a step's work)."""
    loader = DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=2)
    it = iter(loader)
    opt = object()
    t, n, log = 1_000, 0, [(ev.EPOCH_STARTED, it, 64, None, True, True)]
    for _ in range(CYCLES):
        for k in range(ACCUMULATION):
            n += 1
            log.append((ev.FETCH, it, n, t, t + WAIT_NS, 2, None, None))
            t += WAIT_NS
            last = k == ACCUMULATION - 1
            t += rest_between_fetches_ns if fetch_ahead and not last else STEP_WORK_NS
        log.append((ev.OPTIMIZER_STEP, opt, t))
    log.append((ev.EXHAUSTED, it, t + 10, None))
    if evaluated:
        again = iter(loader)
        log.append((ev.EPOCH_STARTED, again, 64, None, False, True))
        for n in range(1, 9):
            log.append((ev.FETCH, again, n, t, t + WAIT_NS, 2, None, None))
            t += WAIT_NS + STEP_WORK_NS
        log.append((ev.EXHAUSTED, again, t, None))
    return processed(log, t)


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
    # an evaluation over the training set after the training (its batches of work, no
    # optimizer step) tells nothing of how the training fetches
    record = _record(fetch_ahead, rest_ns, evaluated=True)
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


def _rows(rests_ns: list[int], stepped: list[bool], forward_ns: list[int | None]) -> RunRecord:
    """One epoch of a row per batch: ``rests_ns[k]`` outside ``next()``, an optimizer step at
    its end where ``stepped[k]``, the instruments on for the row where ``forward_ns[k]`` is not
    None (off for the others), and a forward of that many ns at its start where it is not 0."""
    it = iter(DataLoader(TensorDataset(torch.zeros(2 * len(rests_ns), 2)), batch_size=2))
    opt = object()
    t, log = 1_000, [(ev.EPOCH_STARTED, it, 2 * len(rests_ns), None, True, True)]
    for n, (rest, step, forward) in enumerate(zip(rests_ns, stepped, forward_ns, strict=True), 1):
        log.append((ev.SAMPLING, forward is not None))
        log.append((ev.FETCH, it, n, t, t + WAIT_NS, 2, None, None))
        t += WAIT_NS
        if forward:
            log.append((ev.PHASE, ev.FORWARD, t + 1_000, t + 1_000 + forward, None, None))
        t += rest
        if step:
            log.append((ev.SAMPLING, False))
            log.append((ev.OPTIMIZER_STEP, opt, t - 10))
    log.append((ev.EXHAUSTED, it, t + 10, None))
    return processed(log, t)


SKIPPED = 5  #: the optimizer steps skipped at the start (GradScaler, at too large a scale)
REST_NS = 200_000  #: a step's work outside next(), its optimizer step's included


@pytest.mark.parametrize(
    ("slow", "ahead"), [(STEPS_TO_TELL_ROWS - 1, False), (STEPS_TO_TELL_ROWS, True)]
)
def test_steps_whose_optimizer_step_was_skipped_are_told_by_the_steps_after_the_slow_first(
    slow, ahead
):
    # the skipped steps did their forward and backward (0.8 of a step's rest); the first steps
    # with an optimizer step were slow (the FLOP count's, 2.6 ms of 0.2, on this VM): told
    # against the least of the next STEPS_TO_TELL_ROWS, they are rows of work, unless every one
    # of those was slow
    n = 40
    rests = [int(0.8 * REST_NS)] * SKIPPED + [REST_NS] * (n - SKIPPED)
    rests[SKIPPED : SKIPPED + slow] = [13 * REST_NS] * slow
    record = _rows(rests, [k >= SKIPPED for k in range(n)], [None] * n)
    (info,) = record.loaders
    assert info.fetches_ahead is ahead
    assert len(select_rows(record.snapshot()).wall_ms) == (n - SKIPPED if ahead else n)


def test_a_step_without_its_optimizer_step_is_work_or_a_fetch_as_its_phases_say():
    # timed rows need no rest to tell: a skipped step whose forward ran is a step, however
    # little time it took; an epoch's first row without a forward is a batch fetched ahead,
    # however long the loop took to hand it over (accelerate copies it to the device there)
    n = 12
    rests, stepped = [REST_NS // 10] + [REST_NS] * (n - 1), [False] + [True] * (n - 1)
    skipped = _rows(rests, stepped, [10_000] + [None] * (n - 1))
    assert skipped.loaders[0].fetches_ahead is False
    assert len(select_rows(skipped.snapshot()).wall_ms) == n
    ahead = _rows([REST_NS] * n, stepped, [0] + [None] * (n - 1))
    assert ahead.loaders[0].epoch_first_rows_without_step == 1
    assert ahead.loaders[0].fetches_ahead is True
    assert len(select_rows(ahead.snapshot()).wall_ms) == n - 1


def test_the_runs_end_tells_the_rows_fewer_steps_after_them_left_untold():
    rests = [int(0.8 * REST_NS)] * SKIPPED + [REST_NS] * (STEPS_TO_TELL_ROWS - 1)
    stepped = [k >= SKIPPED for k in range(len(rests))]
    (info,) = _rows(rests, stepped, [None] * len(rests)).loaders
    assert (info.rows_without_step, info.rows_untold) == (SKIPPED, 0)
    assert info.fetches_ahead is False


def _fetching_ahead(driver: str | None, used: list[int], batches: int = 12) -> RunRecord:
    """A loop over a loader that fetches a batch ahead, as accelerate's prepared loader does,
    accumulating two batches a step: each epoch's first fetch is followed at once by the next,
    each batch is trained on after the fetch of the one after it (its last after the
    exhausting fetch); epoch ``e`` trains on ``used[e]`` batches of ``batches`` (fewer: the
    loop broke out of it, its batch fetched ahead never used)."""
    loader = DataLoader(TensorDataset(torch.zeros(2 * batches, 2)), batch_size=2)
    opt, t, log, trained = object(), 1_000, [], 0
    for n_used in used:
        it = iter(loader)
        log.append((ev.EPOCH_STARTED, it, 2 * batches, driver, True, True))
        fetched = min(n_used + 1, batches)
        for n in range(1, fetched + 1):
            log.append((ev.FETCH, it, n, t, t + WAIT_NS, 2, None, None))
            t += WAIT_NS
            if n == 1:
                continue  # the first fetch hands over nothing yet: the next comes at once
            t += STEP_WORK_NS  # the batch before, trained on
            trained += 1
            if trained % 2 == 0:
                log.append((ev.OPTIMIZER_STEP, opt, t))
        if n_used == batches:  # the epoch's end: the exhausting fetch, then its last batch
            log.append((ev.EXHAUSTED, it, t, None))
            t += 10 + STEP_WORK_NS
            trained += 1
            if trained % 2 == 0:
                log.append((ev.OPTIMIZER_STEP, opt, t))
    return processed(log, t)


@pytest.mark.parametrize("driver", ["accelerate", None])
def test_an_epoch_left_early_of_a_loader_that_fetches_ahead_has_no_step_for_its_first_row(
    driver,
):
    """accelerate's prepared loader: an epoch run to its end has a row per batch (its first
    row fetch-only, its last batch trained on after the exhausting fetch); an epoch left
    early has one row more than the batches it trained on, its fetch-only first (``break`` at
    ``max_train_steps``: 61 steps of 60). Only where the driver is known to fetch ahead: a
    loop of one's own keeps every row it made."""
    record = _fetching_ahead(driver, used=[12, 8, 6])
    steps = len(select_rows(record.snapshot()))
    trained = 12 + 8 + 6
    assert steps == (trained if driver == "accelerate" else trained + 2)
    assert len(record.loaders[0].ahead_rows) == (2 if driver == "accelerate" else 0)  # (left)
