"""An epoch of the training loader begun with autograd on and the model in eval mode, which ends
without an optimizer step, is an evaluation over the training set (``model.eval()`` without
``torch.no_grad()``): its rows are noted once it is over (``LoaderInfo.evaluation_rows``), are no
steps, and take back what they counted of how the loader trains. Logs of events over a real
DataLoader iterator, as the instruments log them."""

from __future__ import annotations

import pytest
import torch
from support.builders import processed
from torch.utils.data import DataLoader, TensorDataset

from traceml_nb.analysis.steps import select_rows
from traceml_nb.engine import events as ev
from traceml_nb.engine.instrument.tracer import StepTracer
from traceml_nb.engine.record import RunRecord

BATCHES = 4  #: an epoch's batches
WAIT_NS = 100_000
REST_NS = 2_000_000  #: each batch's work outside next()


def _log(epochs: list[tuple[str, bool, str]], end_mid_epoch: bool = False) -> tuple[list, int]:
    """The events of one epoch per ``(mode, stepped, timed)``: begun with the model in
    ``mode`` ("train" or "eval"; autograd on), an optimizer step after each batch where
    ``stepped``, its batches timed by the instruments where ``timed`` is "forward" or
    "forward+backward" (else "no"); and the clock at their end. ``end_mid_epoch``: the run
    ends before the last epoch's iterator is exhausted."""
    loader = DataLoader(TensorDataset(torch.zeros(2 * BATCHES, 2)), batch_size=2)
    opt = object()
    t, log = 1_000, []
    for e, (mode, stepped, timed) in enumerate(epochs):
        it = iter(loader)
        log.append((ev.EPOCH_STARTED, it, 2 * BATCHES, None, True, mode == "train"))
        for n in range(1, BATCHES + 1):
            log.append((ev.SAMPLING, timed != "no"))
            log.append((ev.FETCH, it, n, t, t + WAIT_NS, 2, None, None))
            t += WAIT_NS
            if timed != "no":
                log.append((ev.PHASE, ev.FORWARD, t + 10, t + 1_000, None, None))
            if timed == "forward+backward":
                log.append((ev.PHASE, ev.BACKWARD, t + 1_010, t + 2_000, None, None))
            t += REST_NS
            if stepped:
                log.append((ev.SAMPLING, False))
                log.append((ev.OPTIMIZER_STEP, opt, t - 10))
        if not (end_mid_epoch and e == len(epochs) - 1):
            log.append((ev.EXHAUSTED, it, t + 10, None))
    return log, t


def _record(epochs: list[tuple[str, bool, str]], *, end_mid_epoch: bool = False) -> RunRecord:
    """The record of :func:`_log`'s events, processed."""
    return processed(*_log(epochs, end_mid_epoch))


TRAIN = ("train", True, "no")


def _evaluated(record: RunRecord) -> list[list[int]]:
    """The loader's rows in each of its ``evaluation_rows``: the numbers of their batches."""
    cols = record.steps.snapshot()
    starts = list(cols.start_ns)
    sources = list(cols.source)
    firsts = sorted(starts[i] for i in range(len(starts)) if sources[i] == 0)
    return [
        [firsts.index(starts[i]) + 1 for i in range(first, end) if sources[i] == 0]
        for first, end in record.loaders[0].evaluation_rows
    ]


@pytest.mark.parametrize("timed", ["no", "forward"])
def test_an_epoch_in_eval_mode_without_an_optimizer_step_is_an_evaluation(timed):
    record = _record([TRAIN, ("eval", False, timed), TRAIN, ("eval", False, timed)])
    (info,) = record.loaders
    assert _evaluated(record) == [list(range(5, 9)), list(range(13, 17))]  # the 2nd, the 4th
    assert len(select_rows(record.snapshot()).wall_ms) == 2 * BATCHES
    # its rows without an optimizer step count nothing of how the loader trains
    assert (info.rows_without_step, info.fetch_only_rows, info.rows_untold) == (0, 0, 0)
    assert info.fetches_ahead is False


@pytest.mark.parametrize(
    "epoch",
    [
        ("eval", True, "no"),  # trains in eval mode (model.train() never called again)
        ("eval", False, "forward+backward"),  # a timed step of it ran a backward
        ("train", False, "no"),  # in training mode: gradient accumulation for all it tells
    ],
)
def test_an_epoch_is_no_evaluation_with_an_optimizer_step_a_backward_or_the_model_training(epoch):
    record = _record([TRAIN, epoch, TRAIN])
    assert record.loaders[0].evaluation_rows == []
    assert len(select_rows(record.snapshot()).wall_ms) == 3 * BATCHES


def test_eval_mode_tells_nothing_where_the_loader_trains_in_eval_mode():
    # its last epoch that trained began in eval mode: an epoch in eval mode without an
    # optimizer step may be its gradient accumulation (a cycle longer than an epoch)
    record = _record([("eval", True, "no"), ("eval", False, "no"), ("eval", True, "no")])
    assert record.loaders[0].evaluation_rows == []


@pytest.mark.parametrize("end_mid_epoch", [False, True])
def test_the_runs_end_tells_an_evaluation_whose_iterator_was_exhausted(end_mid_epoch):
    # the final evaluation of a training loop; a run that ended inside an epoch (interrupted)
    # leaves it as it was
    record = _record([TRAIN, TRAIN, ("eval", False, "no")], end_mid_epoch=end_mid_epoch)
    assert _evaluated(record) == ([] if end_mid_epoch else [list(range(9, 13))])


def test_a_loader_that_never_trained_keeps_its_epochs_in_eval_mode_as_its_steps():
    # an inference loop with autograd on (model.eval() alone): nothing trains
    record = _record([("eval", False, "no"), ("eval", False, "no")])
    assert record.loaders[0].evaluation_rows == []
    assert len(select_rows(record.snapshot()).wall_ms) == 2 * BATCHES


@pytest.mark.parametrize("duty", [1e9, 1e-12])
def test_the_live_chart_reads_the_steps_again_once_an_evaluation_is_found(duty, monkeypatch):
    # the evaluation is known once the next epoch begins; the chart (and the plain frontends'
    # step count), which showed its batches as steps, reads the record again at once where its
    # last reading was cheap enough (REREAD_MAX_DUTY), else later, and in its final update in
    # any case
    from traceml_nb.views.live import data
    from traceml_nb.views.live.handle import RecentSteps

    monkeypatch.setattr(data, "REREAD_MAX_DUTY", duty)
    log, t = _log([TRAIN, TRAIN, ("eval", False, "no"), TRAIN])
    fourth = [k for k, e in enumerate(log) if e[0] == ev.EPOCH_STARTED][3]
    record = RunRecord()
    tracer = StepTracer(record, clock=lambda: t + 20)
    chart = data.StepSeries(lambda row: record.snapshot(row, samples=False))
    counter = RecentSteps(lambda row: record.snapshot(row, samples=False))
    tracer.log.extend(log[:fourth])
    tracer.process()
    chart.update()
    assert chart.steps == counter.poll()[0] == 3 * BATCHES  # the evaluation's, as steps yet
    tracer.log.extend(log[fourth:])
    tracer.process()
    chart.update()
    assert chart.steps == counter.poll()[0] == (3 if duty > 1 else 4) * BATCHES
    tracer.close()
    chart.update(final=True)
    steps = len(select_rows(record.snapshot()).wall_ms)
    assert chart.steps == counter.poll(final=True)[0] == steps == 3 * BATCHES
