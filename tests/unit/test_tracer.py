"""Step segmentation with real torch DataLoaders and optimizers on the CPU."""

from __future__ import annotations

import gc
import statistics
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import traceml_nb
from traceml_nb.engine.optimizer_rows import LEAD_TAKEOVER_STEPS
from traceml_nb.engine.record import (
    FLAG_EPOCH_START,
    FLAG_INTERLEAVED,
    FLAG_OPTIMIZER_STEP,
    FLAG_TRUNCATED,
    SOURCE_MARKER,
    SOURCE_OPTIMIZER,
)

SLEEP_S = 0.002
BATCH = 8


class SleepyDataset(Dataset):
    """Each item costs a known ``sleep_s`` of wall time, like a slow decode."""

    def __init__(self, n: int = 64, sleep_s: float = SLEEP_S) -> None:
        self.n = n
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        t0 = time.perf_counter()
        time.sleep(self.sleep_s)
        self.spent_s = getattr(self, "spent_s", 0.0) + time.perf_counter() - t0
        return torch.randn(16), i % 2


def model_and_opt():
    model = torch.nn.Linear(16, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, opt, x, y, compute_s: float = 0.0) -> None:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if compute_s:
        time.sleep(compute_s)


def rows(run, source):
    s = run.record.steps
    return [i for i in range(len(s)) if s.source[i] == source]


def test_num_workers_0_data_wait_is_sleep_times_batch() -> None:
    model, opt = model_and_opt()
    loader = DataLoader(SleepyDataset(), batch_size=BATCH)
    with traceml_nb.Run("nw0", sample=False) as run:
        for x, y in loader:
            train_step(model, opt, x, y)
    train = rows(run, 0)
    assert len(train) == len(loader)  # the exhausting StopIteration fetch is not a step
    waits_ms = [run.record.steps.wait_ns[i] / 1e6 for i in train]
    # the sleeps the dataset really got (a loaded machine oversleeps), and the nominal ones
    expected = loader.dataset.spent_s * 1e3 / len(train)
    assert statistics.median(waits_ms) == pytest.approx(expected, rel=0.2)
    assert statistics.median(waits_ms) >= SLEEP_S * BATCH * 1e3
    for i in train:
        assert run.record.steps.wall_ns[i] >= run.record.steps.wait_ns[i]
        assert run.record.steps.batch[i] == BATCH
    info = run.record.loaders[0]
    assert (info.num_workers, info.batch_size, info.is_training) == (0, BATCH, True)


def test_num_workers_2_with_prefetch_waits_much_less() -> None:
    model, opt = model_and_opt()

    def median_wait_ms(loader: DataLoader) -> tuple[float, traceml_nb.Run]:
        with traceml_nb.Run(f"nw{loader.num_workers}", sample=False) as run:
            for x, y in loader:
                train_step(model, opt, x, y, compute_s=0.04)
        return statistics.median(run.record.steps.wait_ns[i] / 1e6 for i in rows(run, 0)[2:]), run

    # The same loop on the same machine at the same time: without workers each step waits for
    # its 8 sleeps of 4 ms (≥ 32 ms); with them the loop waits only for the hand-over of a
    # batch the workers had two 40 ms steps to load: ~1 ms idle, 5-8 ms (median) seen on a
    # 2-core VM with another process keeping a core busy (waking an idle virtual CPU).
    sleep_s = 2 * SLEEP_S
    alone_ms, _ = median_wait_ms(DataLoader(SleepyDataset(24, sleep_s), batch_size=BATCH))
    workers_ms, run = median_wait_ms(
        DataLoader(SleepyDataset(64, sleep_s), batch_size=BATCH, num_workers=2, prefetch_factor=4)
    )
    assert alone_ms >= sleep_s * BATCH * 1e3
    assert workers_ms < 0.5 * alone_ms
    assert run.record.loaders[0].num_workers == 2
    assert run.record.loaders[0].prefetch_factor == 4


def test_eval_loader_is_its_own_phase() -> None:
    model, opt = model_and_opt()
    train = DataLoader(SleepyDataset(32, 0.0005), batch_size=BATCH)
    evals = DataLoader(SleepyDataset(48, 0.003), batch_size=BATCH)
    with traceml_nb.Run("eval", sample=False) as run:
        for i, (x, y) in enumerate(train):
            train_step(model, opt, x, y)
            if i == 1:  # an eval pass in the middle of the epoch
                with torch.no_grad():
                    for ex, _ in evals:
                        model(ex)
    t_rows, e_rows = rows(run, 0), rows(run, 1)
    assert len(t_rows) == len(train) and len(e_rows) == len(evals)
    loaders = run.record.loaders
    assert loaders[0].is_training and not loaders[1].is_training
    flags = run.record.steps.flags
    interleaved = [i for i in t_rows if flags[i] & FLAG_INTERLEAVED]
    assert interleaved == [t_rows[1]]  # only the step the eval pass ran inside
    # eval fetches never add to the other training steps' data wait; the one interrupted
    # step is flagged, and the analysis leaves it out of the steady state
    train_wait = [run.record.steps.wait_ns[i] / 1e6 for i in t_rows if i not in interleaved]
    assert statistics.median(train_wait) < 0.5 * 0.003 * BATCH * 1e3


def test_gradient_accumulation_counts_batches_not_optimizer_steps() -> None:
    model, opt = model_and_opt()
    loader = DataLoader(SleepyDataset(64, 0.0), batch_size=BATCH)
    k = 4
    with traceml_nb.Run("accum", sample=False) as run:
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y) / k
            loss.backward()
            if (i + 1) % k == 0:
                opt.step()
                opt.zero_grad()
    assert len(rows(run, 0)) == 8
    assert run.record.optimizer_steps == 2
    assert run.record.loaders[0].is_training
    stepped = [i for i in rows(run, 0) if run.record.steps.flags[i] & FLAG_OPTIMIZER_STEP]
    assert len(stepped) == 2


def test_no_dataloader_counts_optimizer_steps() -> None:
    model, opt = model_and_opt()
    x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
    with traceml_nb.Run("opt", sample=False) as run:
        for _ in range(25):
            train_step(model, opt, x, y)
    assert len(rows(run, SOURCE_OPTIMIZER)) == 25
    assert run.record.loaders == []


def test_several_optimizers_make_one_step_gan_style() -> None:
    gen, opt_g = model_and_opt()
    disc, opt_d = model_and_opt()
    x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
    with traceml_nb.Run("gan", sample=False) as run:
        for _ in range(10):
            train_step(disc, opt_d, x, y)
            train_step(gen, opt_g, x, y)
    assert len(rows(run, SOURCE_OPTIMIZER)) == 10
    assert run.record.optimizer_steps == 20


@pytest.mark.parametrize(("critic_steps", "generator_steps"), [(1, 1), (5, 1), (1, 3), (1, 4)])
def test_a_gan_whose_optimizers_step_unevenly_keeps_its_lead_optimizer(
    critic_steps, generator_steps
) -> None:
    """The critic's optimizer steps first, several times a step (WGAN), or the generator's
    several times after it: the other one takes the lead only at its LEAD_TAKEOVER_STEPS-th
    step in a row with none of the lead's (at 2, three generator steps a step read 3 steps;
    at 4 they do: a sweep's trial steps hundreds of times)."""
    assert LEAD_TAKEOVER_STEPS == 4
    gen, opt_g = model_and_opt()
    critic, opt_c = model_and_opt()
    x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
    with traceml_nb.Run("wgan", sample=False) as run:
        for _ in range(10):
            for _ in range(critic_steps):
                train_step(critic, opt_c, x, y)
            for _ in range(generator_steps):
                train_step(gen, opt_g, x, y)
    if generator_steps < LEAD_TAKEOVER_STEPS:
        assert len(rows(run, SOURCE_OPTIMIZER)) == 10 * critic_steps
    else:  # (the critic's first step ended a row before the generator took the lead)
        assert len(rows(run, SOURCE_OPTIMIZER)) == 1 + 10 * generator_steps


@pytest.mark.parametrize("earlier", ["let go", "kept"])
def test_a_new_optimizer_for_each_trial_takes_the_lead(earlier) -> None:
    """A sweep (or folds, or stages of training) on tensors, a new model and optimizer for
    each trial: each trial's optimizer takes the lead at its LEAD_TAKEOVER_STEPS-th step, and
    its earlier steps end rows too (only the first trial's steps were rows: 20 of 60), whether
    the earlier optimizers were let go or kept."""
    x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
    kept = []
    with traceml_nb.Run("trials", sample=False) as run:
        for _ in range(3):
            model, opt = model_and_opt()
            if earlier == "kept":
                kept.append(opt)
            for _ in range(20):
                train_step(model, opt, x, y)
    assert len(rows(run, SOURCE_OPTIMIZER)) == 60
    assert traceml_nb.Session().result(run).summary.total_steps == 60


def test_explicit_markers() -> None:
    with traceml_nb.Run("markers", sample=False) as run:
        for _ in range(12):
            time.sleep(0.001)
            traceml_nb.step()
    m = rows(run, SOURCE_MARKER)
    assert len(m) == 12 and run.record.markers == 12
    assert all(run.record.steps.wall_ns[i] >= 1_000_000 for i in m)
    traceml_nb.step()  # no active run: a harmless no-op


def test_markers_carry_the_data_wait_of_their_step() -> None:
    loader = DataLoader(SleepyDataset(32, 0.001), batch_size=4)
    with traceml_nb.Run("markers+loader", sample=False) as run:
        for _x, _y in loader:
            run.step()
    m = rows(run, SOURCE_MARKER)
    assert len(m) == len(loader)
    waits = [run.record.steps.wait_ns[i] / 1e6 for i in m]
    assert statistics.median(waits) >= 4.0  # 4 items × 1 ms: a sleep never ends early
    # every item's loading lies inside a marker step's wait, and each wait inside its step
    walls = [run.record.steps.wall_ns[i] / 1e6 for i in m]
    assert loader.dataset.spent_s * 1e3 <= sum(waits) <= sum(walls)


def test_epochs_and_break() -> None:
    model, opt = model_and_opt()
    loader = DataLoader(SleepyDataset(32, 0.0), batch_size=BATCH)
    with traceml_nb.Run("epochs", sample=False) as run:
        for _epoch in range(3):
            for x, y in loader:
                train_step(model, opt, x, y)
        for i, (x, y) in enumerate(loader):  # a half-consumed iterator abandoned by break
            train_step(model, opt, x, y)
            if i == 1:
                break
    t = rows(run, 0)
    flags = run.record.steps.flags
    assert len(t) == 3 * 4 + 2
    assert sum(1 for i in t if flags[i] & FLAG_EPOCH_START) == 4
    assert flags[t[-1]] & FLAG_TRUNCATED
    assert run.record.loaders[0].epochs == 4


def test_iterable_dataset_and_dict_batches() -> None:
    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(20):
                yield {"input": torch.randn(3), "label": i}

    loader = DataLoader(Stream(), batch_size=5)
    with traceml_nb.Run("iterable", sample=False) as run:
        for batch in loader:
            assert set(batch) == {"input", "label"}
    t = rows(run, 0)
    assert len(t) == 4
    assert [run.record.steps.batch[i] for i in t] == [5, 5, 5, 5]
    assert run.record.loaders[0].iterable


def test_a_dataset_in_memory_is_told_through_random_split_and_concatenation() -> None:
    """``random_split`` of a TensorDataset (a ``Subset``), a ``ConcatDataset`` of them: in
    memory, as the TensorDataset is (its workers wait on no storage); a Subset of another
    dataset, or a concatenation with one, is not."""
    from torch.utils.data import ConcatDataset, Subset, random_split

    class Made(Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i):
            return torch.zeros(2)

    tensors = TensorDataset(torch.zeros(16, 2))
    train, _ = random_split(tensors, [0.5, 0.5])
    datasets = {
        "TensorDataset": (tensors, True),
        "random_split": (train, True),
        "ConcatDataset": (ConcatDataset([train, Subset(tensors, [1, 2])]), True),
        "Subset of another": (Subset(Made(), [1, 2]), False),
        "ConcatDataset with another": (ConcatDataset([tensors, Made()]), False),
    }
    for name, (dataset, in_memory) in datasets.items():
        with traceml_nb.Run(name, sample=False) as run:
            for _ in DataLoader(dataset, batch_size=4):
                pass
        assert run.record.loaders[0].in_memory is in_memory, name


def test_the_users_batches_are_untouched() -> None:
    data = TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    plain = [tuple(t.clone() for t in b) for b in DataLoader(data, batch_size=3)]
    with traceml_nb.Run("same", sample=False):
        traced = list(DataLoader(data, batch_size=3))
    assert len(plain) == len(traced)
    for a, b in zip(plain, traced, strict=False):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=False))


def test_exception_in_the_loop_propagates_and_cleans_up() -> None:
    loader = DataLoader(SleepyDataset(32, 0.0), batch_size=4)
    with pytest.raises(ValueError, match="boom"), traceml_nb.Run("fails", sample=False) as run:
        for i, _ in enumerate(loader):
            if i == 3:
                raise ValueError("boom")
    assert run.status == "failed" and run.error == "ValueError: boom"
    assert len(rows(run, 0)) == 4


def test_keyboard_interrupt_propagates_and_is_recorded() -> None:
    with pytest.raises(KeyboardInterrupt), traceml_nb.Run("stop", sample=False) as run:
        raise KeyboardInterrupt
    assert run.status == "interrupted"


def test_runs_cannot_overlap() -> None:
    with traceml_nb.Run("outer", sample=False):
        with pytest.raises(traceml_nb.RunAlreadyActiveError, match="outer"):
            with traceml_nb.Run("inner", sample=False):
                pass
        assert traceml_nb.active_run().name == "outer"


def test_a_users_own_wrapper_keeps_working_after_the_run() -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    calls = []
    loader = DataLoader(SleepyDataset(8, 0.0), batch_size=4)
    try:
        with traceml_nb.Run("wrapped", sample=False) as run:
            ours = _BaseDataLoaderIter.__next__

            def users_wrapper(self):
                calls.append(1)
                return ours(self)

            _BaseDataLoaderIter.__next__ = users_wrapper
            list(loader)
        assert len(rows(run, 0)) == 2
        assert any("another wrapper" in n for n in run.capabilities.notes)
        list(loader)  # after the run: the user's wrapper works, ours is inert
        assert len(calls) == 6
        assert len(run.record.steps) == 2
    finally:
        from leakcheck import ORIGINAL_NEXT

        _BaseDataLoaderIter.__next__ = ORIGINAL_NEXT


def test_two_loaders_zipped_are_both_training_and_share_the_wait() -> None:
    model, opt = model_and_opt()
    a = DataLoader(SleepyDataset(32, 0.001), batch_size=4)
    b = DataLoader(SleepyDataset(32, 0.0), batch_size=4)
    evals = DataLoader(SleepyDataset(16, 0.0), batch_size=4)
    with traceml_nb.Run("zip", sample=False) as run:
        for i, ((x, y), (x2, _)) in enumerate(zip(a, b, strict=False)):
            train_step(model, opt, x + x2, y)
            if i == 2:
                for _ in evals:
                    pass
    infos = run.record.loaders
    assert infos[0].is_training and infos[1].is_training and not infos[2].is_training
    waits_a = [run.record.steps.wait_ns[i] / 1e6 for i in rows(run, 0)]
    waits_b = [run.record.steps.wait_ns[i] / 1e6 for i in rows(run, 1)]
    # a sleep never ends early: each step waited at least 4 × 1 ms, b's step for a's batch too
    assert statistics.median(waits_a) >= 4.0
    assert statistics.median(waits_b) >= 4.0


def test_zipped_loaders_count_each_step_once_in_the_analysis() -> None:
    from traceml_nb.analysis import select_steps

    model, opt = model_and_opt()
    a = DataLoader(SleepyDataset(32, 0.0), batch_size=4)
    b = DataLoader(SleepyDataset(32, 0.0), batch_size=4)
    c = DataLoader(SleepyDataset(16, 0.0), batch_size=4)
    with traceml_nb.Run("zip", sample=False) as run:
        for (x, y), (x2, _) in zip(a, b, strict=False):
            train_step(model, opt, x + x2, y)
        for x, y in c:  # a third training loader, used after the others
            train_step(model, opt, x, y)
    cols, source = select_steps(run.record)
    assert source == "dataloader"
    assert len(cols) == 8 + 4  # a's 8 steps (b's rows overlap them) + c's 4


class _ManualClock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


class _Iter:
    """A stand-in DataLoader iterator for driving the tracer's wrapper by hand."""

    def __init__(self) -> None:
        self._index_sampler = object()
        self._num_yielded = 0
        self._num_workers = 0

    def next_batch(self, _it: object) -> torch.Tensor:
        self._num_yielded += 1
        return torch.zeros(4, 1)


def test_the_log_becomes_rows_every_few_hundred_events_and_at_the_end() -> None:
    from traceml_nb.engine.instrument.tracer import CHECK_EVERY, PROCESS_EVENTS, StepTracer
    from traceml_nb.engine.record import RunRecord

    clock = _ManualClock()
    tracer = StepTracer(RunRecord(), clock=clock)
    it = _Iter()
    fetch = tracer.wrap_next(it.next_batch)
    while it._num_yielded < CHECK_EVERY - 1:
        clock.ns += 1_000_000  # 1 ms steps
        fetch(it)
    assert len(tracer.log) >= PROCESS_EVENTS - 1 and len(tracer.record.steps) == 0  # logged
    clock.ns += 1_000_000
    fetch(it)  # the iterator's CHECK_EVERY-th batch: the log is long enough, it is processed
    assert tracer.log == [] and tracer.processing_ns > 0
    assert len(tracer.record.steps) == CHECK_EVERY - 1  # every step but the open one
    assert list(tracer.record.steps.wall_ns[:9]) == [1_000_000] * 9
    clock.ns += 1_000_000
    fetch(it)
    tracer.close()  # processes the rest and closes the open step as truncated
    steps = tracer.record.steps
    assert len(steps) == it._num_yielded
    assert steps.flags[-1] & FLAG_TRUNCATED
    assert tracer.record.loaders[0].fetches == it._num_yielded


def test_a_loader_iterated_in_another_thread_keeps_every_step() -> None:
    """A prefetching thread iterates the DataLoader while the main thread steps the optimizer:
    the events of both threads reach the rows, and nothing is lost or raised."""
    import queue
    import threading

    loader = DataLoader(TensorDataset(torch.randn(400, 16), torch.zeros(400).long()), batch_size=4)
    model, opt = model_and_opt()
    batches: queue.Queue = queue.Queue(maxsize=8)

    def prefetch() -> None:
        for batch in loader:
            batches.put(batch)
        batches.put(None)

    with traceml_nb.Run("threaded", sample=False) as run:
        worker = threading.Thread(target=prefetch)
        worker.start()
        while (batch := batches.get()) is not None:
            train_step(model, opt, *batch)
        worker.join()
    assert run.record.loaders[0].fetches == 100
    assert run.record.optimizer_steps == 100
    assert len(rows(run, 0)) == 100
    assert run.tracer.processing_ns > 0  # the tracer timed its own segmenting


def test_two_threads_each_iterating_a_loader_keep_their_own_steps_and_sizes() -> None:
    """Common fetches carry their iterator, so a thread switch between two loaders' fetches
    never gives one loader's fetch to the other."""
    import threading

    loaders = [
        DataLoader(TensorDataset(torch.randn(n, 4), torch.zeros(n)), batch_size=b)
        for n, b in ((1003, 4), (997, 7))
    ]
    seen: list[list[int]] = [[], []]

    def consume(k: int) -> None:
        for _epoch in range(2):
            for x, _y in loaders[k]:
                seen[k].append(len(x))

    with traceml_nb.Run("two threads", sample=False) as run:
        threads = [threading.Thread(target=consume, args=(k,)) for k in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for info in run.record.loaders:
        k = 0 if info.batch_size == 4 else 1
        assert info.fetches == len(seen[k]) and info.epochs == 2
        assert [run.record.steps.batch[i] for i in rows(run, info.slot)] == seen[k]


class _WatchedIter(_Iter):
    """An iterator that counts how often its loader and batch number are read."""

    reads = 0

    @property
    def _index_sampler(self) -> object:
        type(self).reads += 1
        return self._sampler

    @_index_sampler.setter
    def _index_sampler(self, sampler: object) -> None:
        self._sampler = sampler


def test_a_fetch_logs_one_tuple_and_the_loaders_settings_are_read_when_processed() -> None:
    """A fetch appends one tuple (the iterator, its batch count, the times, the batch's shape),
    which is its typed event (an epoch's first also its sample count); the loader's settings
    are read when the log is processed."""
    from traceml_nb.engine.events import EPOCH_STARTED, FETCH, Fetch, typed
    from traceml_nb.engine.instrument.tracer import StepTracer
    from traceml_nb.engine.record import RunRecord

    tracer = StepTracer(RunRecord())
    tracer.attach_reader()  # nothing is processed until the reader asks
    it = _WatchedIter()
    fetch = tracer.wrap_next(it.next_batch)
    for _ in range(300):
        fetch(it)
    # the sampler's type once a fetch (a field of the iterator at hand), its length at the
    # epoch's first
    assert 300 <= _WatchedIter.reads <= 303
    started, *fetches = tracer.log
    assert started[:2] == (EPOCH_STARTED, it)
    assert all(item[:3] == (FETCH, it, n) for n, item in enumerate(fetches, 1))
    events = [typed(item) for item in fetches]
    assert all(type(e) is Fetch and e.iterator is it and e.shape == (4, 1) for e in events)
    assert [e.number for e in events] == list(range(1, 301))
    before = _WatchedIter.reads
    tracer.process()
    assert _WatchedIter.reads > before and len(tracer.record.loaders) == 1
    tracer.close()
    assert tracer.record.loaders[0].fetches == 300
    assert set(tracer.record.steps.batch) == {4}


def test_a_loader_with_persistent_workers_starts_its_epochs_over_on_one_iterator() -> None:
    """With persistent workers, ``iter(loader)`` restarts the same iterator: every fetch of it
    is read, so an epoch abandoned by ``break`` does not shift the next one's batches."""
    loader = DataLoader(_PAIRS, batch_size=5, num_workers=1, persistent_workers=True)
    real = []
    with traceml_nb.Run("persistent", sample=False) as run:
        for i, (_x, y) in enumerate(loader):
            real.append(len(y))
            if i == 1:
                break
        for _x, y in loader:
            real.append(len(y))
    assert real == [5, 5, 5, 5, 5, 5, 3]
    t = rows(run, 0)
    assert [run.record.steps.batch[i] for i in t] == real
    flags = run.record.steps.flags
    assert [i for i, row in enumerate(t) if flags[row] & FLAG_EPOCH_START] == [0, 2]
    assert run.record.loaders[0].epochs == 2


def test_an_epoch_start_processed_before_its_fetch_keeps_what_it_logged() -> None:
    """The wrapper looks at its log between an epoch's start and its first fetch (a loop that
    makes a new iterator every few batches processes it there), so the two can be processed
    apart: the epoch's samples and what iterates the loader are still those logged at its
    start, not read again later."""
    from traceml_nb.engine.events import EPOCH_STARTED, EXHAUSTED, FETCH
    from traceml_nb.engine.instrument.tracer import StepTracer
    from traceml_nb.engine.record import RunRecord

    it = iter(DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=4))  # 10 samples now
    tracer = StepTracer(RunRecord())
    tracer.log.append(
        (EPOCH_STARTED, it, 6, "transformers", True, True)
    )  # 6 when the epoch started
    tracer.process()
    tracer.log += [
        (FETCH, it, 1, 100, 150, None, None, None),
        (FETCH, it, 2, 200, 250, None, None, None),
    ]
    tracer.process()
    tracer.log.append((EXHAUSTED, it, 300, None))
    tracer.close()
    (info,) = tracer.record.loaders
    assert info.driver == "transformers"
    assert list(tracer.record.steps.batch) == [4, 2]


def test_optimizer_steps_counted_after_the_first_loader_step_keep_their_place() -> None:
    """Once a loader has closed a step the hook only counts; each count is applied where it
    happened: two optimizers a step (GAN style), an extra step after the epoch, and an
    eval loader in between that never becomes a training loader."""
    train = DataLoader(TensorDataset(torch.randn(40, 16), torch.zeros(40).long()), batch_size=4)
    evaluation = DataLoader(TensorDataset(torch.randn(8, 16), torch.zeros(8).long()), batch_size=4)
    g, opt_g = model_and_opt()
    d, opt_d = model_and_opt()
    with traceml_nb.Run("counted", sample=False) as run:
        for x, y in train:
            train_step(g, opt_g, x, y)
            train_step(d, opt_d, x, y)
        opt_g.step()  # after the epoch: counted, applied when the run ends
        for _x, _y in evaluation:
            pass
    info_train, info_eval = run.record.loaders
    assert run.record.optimizer_steps == 2 * 10 + 1
    assert info_train.optimizer_steps == 2 * 10 + 1
    assert info_eval.optimizer_steps == 0
    train_rows = rows(run, 0)
    assert len(train_rows) == 10
    assert all(run.record.steps.flags[i] & FLAG_OPTIMIZER_STEP for i in train_rows)
    assert not any(run.record.steps.flags[i] & FLAG_OPTIMIZER_STEP for i in rows(run, 1))


def test_an_interrupt_while_the_log_is_processed_loses_no_later_event(monkeypatch) -> None:
    """Ctrl-C can arrive while process() runs in the training thread: the events it had not
    reached stay in the log and the run's end turns them into rows."""
    from traceml_nb.engine.instrument.tracer import StepTracer
    from traceml_nb.engine.record import RunRecord
    from traceml_nb.engine.segment import StepSegmenter

    real = StepSegmenter._fetch
    calls = []

    def interrupted_once(self, event):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real(self, event)

    monkeypatch.setattr(StepSegmenter, "_fetch", interrupted_once)
    clock = _ManualClock()
    tracer = StepTracer(RunRecord(), clock=clock)
    tracer.attach_reader()  # nothing is segmented until the reader asks
    it = _Iter()
    fetch = tracer.wrap_next(it.next_batch)
    for _ in range(10):
        clock.ns += 1_000_000
        fetch(it)
    with pytest.raises(KeyboardInterrupt):
        tracer.process()
    assert len(tracer.log) == 10 - 6  # the events after the interrupted one are back
    assert len(tracer.record.steps) == 4  # rows made before the interrupt are written
    monkeypatch.setattr(StepSegmenter, "_fetch", real)
    tracer.close()
    assert len(tracer.record.steps) == 9  # one fetch lost to the interrupt, no more
    assert tracer.record.steps.flags[-1] & FLAG_TRUNCATED


class _CurriculumSampler(torch.utils.data.Sampler):
    """A sampler whose length changes from one epoch to the next (``set_epoch`` before each)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.sizes[self.epoch]

    def __iter__(self):
        return iter(range(self.sizes[self.epoch]))


class _NoLenSampler(torch.utils.data.Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def _drop_odd(samples):
    """A collate that filters samples out, as a 'skip corrupt images' collate does."""
    kept = [s for s in samples if int(s[1]) % 2 == 0]
    return torch.utils.data.default_collate(kept)


def _dict_items(n: int):
    class Dicts(Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int):
            return {"x": torch.randn(3), "label": i}

    return Dicts()


_PAIRS = TensorDataset(torch.randn(23, 4), torch.arange(23))


class _PreBatched(Dataset):
    """Items that are whole batches of varying size (loaded with ``batch_size=None``)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return torch.randn(i + 2, 4), torch.arange(i + 2)


def _loaders() -> dict[str, DataLoader]:
    """Loaders whose batches vary in size in every way a loader can make them vary."""
    return {
        "partial last batch": DataLoader(_PAIRS, batch_size=5),
        "drop_last": DataLoader(_PAIRS, batch_size=5, drop_last=True),
        "shuffled": DataLoader(_PAIRS, batch_size=6, shuffle=True),
        "subset sampler": DataLoader(
            _PAIRS, batch_size=4, sampler=torch.utils.data.SubsetRandomSampler(range(0, 23, 2))
        ),
        "two workers": DataLoader(_PAIRS, batch_size=5, num_workers=2),
        "dict batches": DataLoader(_dict_items(11), batch_size=4),
        "length changes per epoch": DataLoader(
            _PAIRS, batch_size=4, sampler=_CurriculumSampler([23, 10, 3])
        ),
        "sampler without len": DataLoader(_PAIRS, batch_size=5, sampler=_NoLenSampler(23)),
        "collate that drops samples": DataLoader(_PAIRS, batch_size=5, collate_fn=_drop_odd),
        "custom batch sampler": DataLoader(_PAIRS, batch_sampler=[[0, 1, 2], [3], [4, 5]]),
        "pre-batched items, no batching": DataLoader(_PreBatched(), batch_size=None),
    }


@pytest.mark.parametrize("name", list(_loaders()))
def test_batch_sizes_are_the_batches_real_sizes(name: str) -> None:
    loader = _loaders()[name]
    real = []
    with traceml_nb.Run(name, sample=False) as run:
        for epoch in range(3):
            if isinstance(loader.sampler, _CurriculumSampler):
                loader.sampler.set_epoch(epoch)
            for batch in loader:
                labels = batch["label"] if isinstance(batch, dict) else batch[1]
                real.append(labels.shape[0])
    recorded = [run.record.steps.batch[i] for i in rows(run, 0)]
    if name == "sampler without len":
        # counted as full batches; the epoch's last batch of a sampler without a length is
        # unknown, never a wrong size
        real = [size if (i + 1) % 5 else -1 for i, size in enumerate(real)]
    assert recorded == real
    assert len(real) >= 6


def test_a_dataset_that_iterates_a_loader_itself_keeps_both_sizes_right() -> None:
    inner = DataLoader(_PAIRS, batch_size=3, collate_fn=_drop_odd)

    class Nested(Dataset):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int):
            x, y = next(iter(inner))
            return x.sum(0), i

    outer = DataLoader(Nested(), batch_size=4)
    with traceml_nb.Run("nested", sample=False) as run:
        sizes = [len(y) for _x, y in outer]
    slot = {info.batch_size: info.slot for info in run.record.loaders}
    assert [run.record.steps.batch[i] for i in rows(run, slot[4])] == sizes == [4, 4, 2]
    assert {run.record.steps.batch[i] for i in rows(run, slot[3])} == {2}


def test_with_a_reader_attached_the_loop_only_logs_until_the_reader_processes() -> None:
    from traceml_nb.engine.instrument.tracer import (
        CHECK_EVERY,
        PROCESS_EVENTS,
        READER_MAX_EVENTS,
        StepTracer,
    )
    from traceml_nb.engine.record import RunRecord

    clock = _ManualClock()
    tracer = StepTracer(RunRecord(), clock=clock)
    tracer.attach_reader()
    it = _Iter()
    fetch = tracer.wrap_next(it.next_batch)
    for _ in range(PROCESS_EVENTS + 10):
        clock.ns += 2_000_000
        fetch(it)
    assert len(tracer.record.steps) == 0  # past the loop's own trigger: only logged
    tracer.process()  # the reader, before it reads
    assert len(tracer.record.steps) == PROCESS_EVENTS + 9
    assert tracer.reader_processing_ns > 0 and tracer.processing_ns == 0
    # a reader that fell behind or stopped: the loop processes once the log is that long, at
    # its next look (every CHECK_EVERY batches)
    n = fetches_until_processed(tracer, fetch, it, clock)
    assert READER_MAX_EVENTS <= n <= READER_MAX_EVENTS + CHECK_EVERY
    tracer.attach_reader(False)  # the reader has stopped: the loop's own trigger again
    n = fetches_until_processed(tracer, fetch, it, clock)
    assert PROCESS_EVENTS <= n <= PROCESS_EVENTS + CHECK_EVERY
    tracer.close()


def fetches_until_processed(tracer, fetch, it, clock) -> int:
    """Fetch 1 us steps until the tracer turns its log into rows; how many fetches it took."""
    rows = len(tracer.record.steps)
    n = 0
    while len(tracer.record.steps) == rows:
        clock.ns += 1_000
        fetch(it)
        n += 1
    return n


def _train_and_evaluate(reader: bool) -> traceml_nb.Run:
    """Two epochs of a training loader with a fresh eval loader after each (new loaders
    appear while a reader may be processing), two optimizers a step, markers now and then."""
    import threading

    model, opt = model_and_opt()
    g, opt_g = model_and_opt()
    train = DataLoader(TensorDataset(torch.randn(240, 16), torch.zeros(240).long()), batch_size=4)
    stop = threading.Event()
    with traceml_nb.Run("reader" if reader else "inline", sample=False) as run:

        def read() -> None:
            with run.reading():
                # a read every half millisecond: a reader that never lets go of the GIL makes
                # each step wait out the switch interval (60-120 s instead of 2 s with one torch
                # thread), which a live view's few reads a second never do
                while not stop.wait(0.0005):
                    run.snapshot()
                    len(run.record.steps.snapshot().wall_ns)

        thread = threading.Thread(target=read)
        if reader:
            thread.start()
        for epoch in range(2):
            for i, (x, y) in enumerate(train):
                train_step(model, opt, x, y)
                train_step(g, opt_g, x, y)
                if i % 20 == 0:
                    traceml_nb.step()
            evaluation = DataLoader(TensorDataset(torch.randn(40 + epoch, 16)), batch_size=8)
            for (_x,) in evaluation:
                pass
        stop.set()
        if reader:
            thread.join()
    return run


def assert_same_steps(one: traceml_nb.Run, other: traceml_nb.Run) -> None:
    """Two runs of :func:`_train_and_evaluate` made the same loaders, counts and step rows
    (their times aside)."""
    a, b = one.record, other.record
    timed = ("dataset_id", "phase_ns", "phase_before_training_ns")  # times and identities

    def loaders(record):
        return [{k: v for k, v in i.to_dict().items() if k not in timed} for i in record.loaders]

    assert loaders(a) == loaders(b)
    assert (a.optimizer_steps, a.markers) == (b.optimizer_steps, b.markers) == (240, 6)
    sa, sb = a.steps.snapshot(), b.steps.snapshot()
    for column in ("batch", "source", "flags"):
        assert list(getattr(sa, column)) == list(getattr(sb, column)), column


def test_a_reader_processing_on_its_own_thread_gives_the_rows_the_loop_would() -> None:
    inline, read = _train_and_evaluate(False), _train_and_evaluate(True)
    assert read.tracer.reader_processing_ns > 0
    assert_same_steps(inline, read)


@pytest.mark.parametrize("who", ["the loop", "a reader"])
def test_a_bug_in_our_processing_stops_the_tracing_not_the_training(monkeypatch, who) -> None:
    from traceml_nb.engine.instrument.tracer import PROCESS_EVENTS
    from traceml_nb.engine.segment import StepSegmenter

    real = StepSegmenter._fetch

    def broken_later(self, event):
        loaders = self.record.loaders  # (the fetch announces its loader: none at the first)
        if loaders and loaders[0].fetches >= 300:
            raise RuntimeError("a bug of ours")
        real(self, event)

    monkeypatch.setattr(StepSegmenter, "_fetch", broken_later)
    model, opt = model_and_opt()
    loader = DataLoader(
        TensorDataset(torch.randn(4000, 16), torch.zeros(4000).long()), batch_size=4
    )
    seen = 0
    with traceml_nb.Run("broken", sample=False) as run:
        for i, (x, y) in enumerate(loader):
            train_step(model, opt, x, y)
            traceml_nb.step()
            seen += 1
            if who == "a reader" and i % 100 == 99:
                run.snapshot()
    assert seen == 1000  # every batch reached the loop
    assert not run.tracer.active and run.tracer.log == []
    assert "RuntimeError: a bug of ours" in run.tracer.error
    assert any("step tracing stopped" in n for n in run.capabilities.notes)
    assert PROCESS_EVENTS <= list(run.record.steps.source).count(0) <= 300  # kept, then stopped
    assert run.record.loaders[0].fetches <= 300
    result = run.result()  # the partial run still gives a report
    assert result is not None


class _Listener:
    """A listener of the optimizer hook that is told every ``every`` steps and notes the steps
    at which the hook looked at it at all."""

    def __init__(self, every: int, clock: list[int]) -> None:
        self.every, self.clock = every, clock
        self._countdown = 1
        self.looked: list[int] = []
        self.told: list[int] = []

    @property
    def countdown(self) -> int:
        if not self.looked or self.looked[-1] != self.clock[0]:
            self.looked.append(self.clock[0])
        return self._countdown

    @countdown.setter
    def countdown(self, value: int) -> None:
        self._countdown = value

    def optimizer_step_ended(self, optimizer: object) -> None:
        self.told.append(self.clock[0])
        self._countdown = self.every


def test_the_optimizer_hook_looks_at_its_listeners_only_when_the_least_countdown_runs_out() -> None:
    """Each listener is told at the step its own countdown runs out, as if counted down every
    step; in between the hook touches none of them (a step after a cache-evicting one then
    pays for no listener's object)."""
    from traceml_nb.engine.instrument.tracer import StepTracer
    from traceml_nb.engine.record import RunRecord

    step = [0]
    every3, every5 = _Listener(3, step), _Listener(5, step)
    hook = StepTracer(RunRecord()).optimizer_hook([every3, every5])
    for step[0] in range(1, 16):
        hook(None, (), {})
    assert every3.told == [1, 4, 7, 10, 13] and every5.told == [1, 6, 11]
    assert every3.looked == every5.looked == [1, 4, 6, 7, 10, 11, 13]


def test_a_look_asked_for_early_owes_each_listener_only_the_steps_since_the_last() -> None:
    """``look_soon()`` (an epoch began: the FLOP count looks at the trained parameters) has
    the hook look at the next step; the other listener's countdown runs as before."""
    from traceml_nb.engine.instrument.tracer import StepTracer
    from traceml_nb.engine.record import RunRecord

    step = [0]
    every5, every7 = _Listener(5, step), _Listener(7, step)
    hook = StepTracer(RunRecord()).optimizer_hook([every5, every7])
    for step[0] in range(1, 16):
        if step[0] == 3:
            every7.countdown = 1
            hook.look_soon()  # type: ignore[attr-defined]
        hook(None, (), {})
    assert every5.told == [1, 6, 11] and every7.told == [1, 3, 10]
    assert every5.looked == every7.looked == [1, 3, 6, 10, 11]


def test_a_loop_without_a_loader_bounds_its_log_at_the_optimizer_hooks_looks() -> None:
    """The optimizer hook measures the log only when it looks (every ``CHECK_EVERY`` steps at
    most): a loop without a DataLoader has its log processed once it passes
    ``READER_MAX_EVENTS``, within ``CHECK_EVERY`` steps, and not before."""
    from traceml_nb.engine.instrument.tracer import CHECK_EVERY, READER_MAX_EVENTS, StepTracer
    from traceml_nb.engine.record import RunRecord

    model, opt = model_and_opt()
    tracer = StepTracer(RunRecord())
    hook = tracer.optimizer_hook()
    hook(opt, (opt,), {})  # an optimizer new to the run processes the log (a sweep's trial)
    assert len(tracer.log) == 0
    steps = 0
    while len(tracer.log) == steps and steps <= 2 * READER_MAX_EVENTS:
        hook(opt, (opt,), {})
        steps += 1
    assert READER_MAX_EVENTS < steps <= READER_MAX_EVENTS + CHECK_EVERY
    assert len(tracer.log) == 0
    assert tracer.record.optimizer_steps == steps + 1
    tracer.close()


def test_a_dataset_the_loop_lets_go_is_freed_during_the_run() -> None:
    """The tracer holds a loader's batch sampler weakly, and with it the dataset: a stage's
    or a sweep's dataset is freed once the log that names its iterator is processed, as
    without the run, not at the run's end."""
    import weakref

    def stage() -> weakref.ref:
        data = TensorDataset(torch.randn(64, 16), torch.zeros(64, dtype=torch.long))
        model, opt = model_and_opt()
        for x, y in DataLoader(data, batch_size=BATCH, shuffle=True):
            train_step(model, opt, x, y)
        return weakref.ref(data)

    with traceml_nb.Run("sweep", sample=False) as run:
        first = stage()
        run._tracer.process()  # the live view's thread, or the log's length, does this
        gc.collect()
        freed_during_the_run = first() is None
        second = stage()
    assert freed_during_the_run
    assert [loader.fetches for loader in run.record.loaders] == [8, 8]  # two loaders
    gc.collect()
    assert second() is None


class _Sampler:
    def __iter__(self):
        return iter(())


def test_a_sampler_in_a_freed_samplers_place_is_another_loader() -> None:
    """CPython gives a freed object's place, and so its ``id()``, to a later one: on 3.11 and
    3.12 within the next few objects of its size, on 3.13 later (an object that had a weak
    reference). The later sampler is put in the freed one's place here, its ``id()`` keyed to
    the freed one's dead reference, as it is once CPython reuses the place."""
    from traceml_nb.engine.instrument.tracer import StepTracer
    from traceml_nb.engine.record import RunRecord

    tracer = StepTracer(RunRecord())
    dataset = _Sampler()
    sampler = _Sampler()
    key, new = tracer._loader_key(sampler, dataset)
    assert new and tracer._loader_key(sampler, dataset) == (key, False)
    place = id(sampler)
    del sampler
    in_its_place = _Sampler()
    tracer._loader_keys[(id(in_its_place), id(dataset))] = tracer._loader_keys.pop(
        (place, id(dataset))
    )
    assert tracer._loader_key(in_its_place, dataset) == (key + 1, True)
    held = object()  # without weak references: held, its key kept
    held_key, _ = tracer._loader_key(held, dataset)
    assert tracer._loader_key(held, dataset) == (held_key, False)


def test_one_sampler_over_two_datasets_is_two_loaders() -> None:
    """fastai's DataLoaders hand torch's iterators one sampler, each its own stand-in dataset;
    a dataset freed and another in its place is another loader, and one without weak
    references (a list) is told by its ``id()``."""
    from traceml_nb.engine.instrument.tracer import StepTracer
    from traceml_nb.engine.record import RunRecord

    tracer = StepTracer(RunRecord())
    shared, train, valid = _Sampler(), _Sampler(), _Sampler()
    train_key, _ = tracer._loader_key(shared, train)
    valid_key, new = tracer._loader_key(shared, valid)
    assert new and valid_key != train_key
    assert tracer._loader_key(shared, train) == (train_key, False)
    place = id(valid)
    del valid
    in_its_place = _Sampler()
    tracer._loader_keys[(id(shared), id(in_its_place))] = tracer._loader_keys.pop(
        (id(shared), place)
    )
    assert tracer._loader_key(shared, in_its_place) == (valid_key + 1, True)
    items = [(1, 2), (3, 4)]
    items_key, new = tracer._loader_key(shared, items)
    assert new and tracer._loader_key(shared, items) == (items_key, False)
