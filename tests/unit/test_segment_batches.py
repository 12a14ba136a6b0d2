"""The step rows do not depend on where the log was cut into the batches it was processed in.

Which batches the training thread's log is processed in depends on the threads' timing (a
reader's ticks, the loop's own checks, an epoch's start: the wrapper looks at its log between
an epoch's start and its first fetch). So random logs over real DataLoader iterators, with
every kind of event the instruments log, are processed whole and cut at random places, the
places between an epoch's start and its fetch included, and must give the same record.
"""

from __future__ import annotations

import random
from dataclasses import astuple
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from traceml_nb.engine import events as ev
from traceml_nb.engine.instrument.tracer import StepTracer
from traceml_nb.engine.record import RunRecord

LOGS = 60
CUTS = 3  #: ways each log is cut


class _Stream(IterableDataset):
    def __iter__(self):
        for _ in range(37):
            yield torch.zeros(2), torch.zeros(1)


def _loaders() -> list[DataLoader]:
    def pairs(n: int) -> TensorDataset:
        return TensorDataset(torch.zeros(n, 2), torch.zeros(n, 1))

    return [
        DataLoader(pairs(100), batch_size=16),  # sizes counted
        DataLoader(pairs(50), batch_size=7, collate_fn=lambda b: b),  # sizes read
        DataLoader(_Stream(), batch_size=5),  # an iterable dataset: read
    ]


def _random_log(rng: random.Random, iterators: list[Any], optimizers: list[Any]) -> list[tuple]:
    """Fetches (each iterator counting its batches, epochs starting and ending), optimizer
    steps of two optimizers, markers, phases and the phase sampling switched on and off."""
    count = {id(it): 0 for it in iterators}
    t, log, sampling = 1_000, [], False
    for _ in range(rng.randint(5, 300)):
        t += rng.randint(1, 1_000)
        r = rng.random()
        if r < 0.45:
            it = rng.choice(iterators)
            if rng.random() < 0.05:
                log.append((ev.EXHAUSTED, it, t, None))
                count[id(it)] = 0
                continue
            number = count[id(it)] = count[id(it)] + 1
            if number == 1 and rng.random() < 0.8:
                log.append(
                    (ev.EPOCH_STARTED, it, rng.choice([-1, 37, 100]), "transformers", True, True)
                )
            wait = rng.randint(0, 500)
            log.append((ev.FETCH, it, number, t, t + wait, rng.choice([-1, 5, 16]), None, None))
            t += wait
        elif r < 0.75:
            log.append((ev.OPTIMIZER_STEP, rng.choice(optimizers[:1] * 4 + optimizers), t))
        elif r < 0.8:
            log.append((ev.MARKER, t))
        elif r < 0.95:
            span = rng.randint(0, 300)
            log.append((ev.PHASE, rng.randint(0, 2), t, t + span, None, None))
            t += span
        else:
            sampling = not sampling
            log.append((ev.SAMPLING, sampling))
    log.append((ev.MARKER, t + 1))
    return log


def _record_of(batches: list[list[tuple]]) -> tuple:
    """Process ``batches`` one after the other, as the tracer's threads do, and close."""
    record = RunRecord()
    end = batches[-1][-1][1]  # the closing marker's time
    tracer = StepTracer(record, clock=lambda: end)
    for batch in batches:
        tracer.log.extend(batch)
        tracer.process()
    tracer.close()
    assert tracer.error is None, tracer.error
    steps = record.steps.snapshot()
    return (  # (the columns' values as text: NaN, a value not measured, equals itself there)
        tuple(repr(list(getattr(steps, name))) for name in record.steps.COLUMNS),
        tuple(astuple(info) for info in record.loaders),
        record.optimizer_steps,
        record.markers,
        tuple(sorted(record.first_fetch_wait_ns.items())),
    )


def _cut(log: list[tuple], rng: random.Random) -> list[list[tuple]]:
    places = sorted(rng.sample(range(1, len(log)), k=min(len(log) - 1, rng.randint(1, 12))))
    return [log[a:b] for a, b in zip([0, *places], [*places, len(log)], strict=True)]


@pytest.mark.parametrize("seed", range(LOGS))
def test_the_rows_do_not_depend_on_where_the_log_was_cut(seed: int) -> None:
    rng = random.Random(seed)
    iterators = [iter(loader) for loader in _loaders() for _ in range(2)]  # never fetched
    optimizers = [torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1) for _ in "ab"]
    log = _random_log(rng, iterators, optimizers)
    whole = _record_of([log])
    assert whole[0][0] != "[]", "no rows: the log made nothing to compare"
    for _ in range(CUTS):
        assert _record_of(_cut(log, rng)) == whole
