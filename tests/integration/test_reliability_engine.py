"""The engine never harms the training: faults, coexistence, long and repeated runs."""

from __future__ import annotations

import gc
import re
import threading
import tracemalloc

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import traceml_nb
from traceml_nb.engine.instrument.tracer import StepTracer
from traceml_nb.engine.record import FLAG_TRUNCATED, RunRecord


class FailingDataset(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        if i == 21:
            raise ValueError(f"corrupt image at index {i}")
        return torch.randn(4), 0


def tiny_loader(n: int = 64, batch: int = 8, **kw) -> DataLoader:
    return DataLoader(
        TensorDataset(torch.randn(n, 4), torch.zeros(n, dtype=torch.long)), batch_size=batch, **kw
    )


def fit(loader, model=None, opt=None, stop_after: int | None = None) -> int:
    if model is None:
        model = torch.nn.Linear(4, 2)
    if opt is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
        if stop_after is not None and n == stop_after:
            break
    return n


def test_an_exception_inside_a_worker_reaches_the_user_unchanged() -> None:
    # one worker: torch takes 5 s per worker to shut down a loader whose worker raised (its
    # join timeout), traced or not, once the iterator is collected
    loader = DataLoader(FailingDataset(), batch_size=4, num_workers=1)
    with pytest.raises(ValueError, match="corrupt image at index 21"):
        with traceml_nb.Run("worker-error", sample=True) as run:
            fit(loader)
    assert run.status == "failed"
    assert "corrupt image" in (run.error or "")
    assert len(run.record.steps) >= 1  # the partial record is kept


def test_system_exit_propagates() -> None:
    with pytest.raises(SystemExit), traceml_nb.Run("exit", sample=True) as run:
        fit(tiny_loader(), stop_after=2)
        raise SystemExit(3)
    assert run.status == "failed" and run.error == "SystemExit: 3"


def test_a_half_consumed_loader_with_workers_is_fine() -> None:
    loader = tiny_loader(256, 8, num_workers=2)
    with traceml_nb.Run("break") as run:
        assert fit(loader, stop_after=5) == 5
    assert run.status == "completed"
    assert run.record.steps.flags[-1] & FLAG_TRUNCATED or run.record.steps.source[-1] == 254
    assert fit(loader, stop_after=3) == 3  # the loader still works afterwards


def test_an_infinite_iterator_left_early() -> None:
    class Forever(IterableDataset):
        def __iter__(self):
            while True:
                yield torch.randn(4), 0

    with traceml_nb.Run("forever", sample=False) as run:
        assert fit(DataLoader(Forever(), batch_size=4), stop_after=30) == 30
    assert sum(1 for s in run.record.steps.source if s == 0) == 30


def test_coexists_with_torch_profiler() -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with traceml_nb.Run("with-profiler", sample=False) as run:
            fit(tiny_loader())
    names = {e.key for e in prof.key_averages()}
    assert any("DataLoader" in n for n in names)  # the loader's own record_function still runs
    assert sum(1 for s in run.record.steps.source if s == 0) == 8


def test_profiler_started_inside_a_run() -> None:
    from torch.profiler import profile

    with traceml_nb.Run("profiler-inside", sample=False) as run, profile():
        fit(tiny_loader())
    assert sum(1 for s in run.record.steps.source if s == 0) == 8


def test_torch_compiled_model() -> None:
    """A compiled model is compiled once, as without the run: no graph break, no warning of
    ours (the phase instruments are out of the way of torch.compile), its forward timed whole."""
    import warnings

    import torch._dynamo.utils as dynamo_utils

    from traceml_nb.analysis.steps import select_rows

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    model = torch.compile(torch.nn.Linear(4, 2), backend="eager")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with traceml_nb.Run("compiled", sample=False) as run:
            fit(tiny_loader(), model=model)
    assert [str(w.message) for w in warned] == []
    assert dict(dynamo_utils.counters["stats"])["unique_graphs"] == 1
    assert not dynamo_utils.counters["graph_break"]
    assert run.record.loaders[0].is_training
    assert sum(1 for s in run.record.steps.source if s == 0) == 8
    sampled = select_rows(run.record.snapshot(samples=False)).phase_ms.values
    assert len(sampled) and (sampled[:, 1] > 0).all()  # the compiled model's forward


def test_data_parallel_model() -> None:
    model = torch.nn.DataParallel(torch.nn.Linear(4, 2))
    with traceml_nb.Run("dp", sample=False) as run:
        fit(tiny_loader(), model=model)
    assert run.record.loaders[0].is_training


def test_several_dataloaders_in_turn() -> None:
    with traceml_nb.Run("several", sample=False) as run:
        fit(tiny_loader(32, 8))
        fit(tiny_loader(48, 8))
        fit(tiny_loader(16, 4))
    assert [info.fetches for info in run.record.loaders] == [4, 6, 4]
    assert all(info.is_training for info in run.record.loaders)


def _resident_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.M).group(1))


def _reset_peak_resident() -> bool:
    """Start the process's peak resident memory (``VmHWM``) over from what it holds now (Linux
    4.0 on); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def test_a_million_fast_steps_keep_memory_bounded() -> None:
    """1,000,000 synthetic steps through the real tracer: the process's peak resident memory
    grows far less than 150 MB (the record itself under 100 bytes a step). The peak is the
    kernel's own (tracemalloc made the test 5x slower, and sees only what Python allocates)."""

    class It:
        _index_sampler = object()
        _num_yielded = 1

    it = It()
    batch = torch.zeros(2, 1)

    def next_fn(_it):
        return batch

    rec = RunRecord()
    tracer = StepTracer(rec)
    gc.collect()
    if not _reset_peak_resident():
        pytest.skip("the peak resident memory cannot be reset here (/proc/self/clear_refs)")
    before = _resident_kib("VmRSS")
    fetch = tracer.wrap_next(next_fn)
    for _ in range(1_000_000):
        fetch(it)
    tracer.close()
    peak_growth = (_resident_kib("VmHWM") - before) * 1024
    assert len(rec.steps) == 1_000_000
    assert rec.nbytes / len(rec.steps) < 100
    assert peak_growth < 150 * 2**20, f"peak {peak_growth / 2**20:.0f} MB"


def test_two_hundred_consecutive_runs_do_not_grow() -> None:
    loader = tiny_loader(16, 8)

    def one() -> None:
        with traceml_nb.Run("again", interval=0.02):
            fit(loader)

    for _ in range(20):
        one()
    gc.collect()
    threads_before = threading.active_count()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(200):
            one()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert threading.active_count() == threads_before
    assert after - base < 2 * 2**20, f"grew {(after - base) / 1024:.0f} KiB over 200 runs"


def test_a_runs_options_are_one_object_its_keywords_over_it():
    """``RunOptions`` carries how a run is measured and concluded from the magic's line to the
    session; ``Run``'s keywords are its fields, over a given ``options``."""
    from traceml_nb.engine.options import RunOptions
    from traceml_nb.engine.run import Run

    base = RunOptions(interval=0.05, compare=False, warmup=3)
    run = Run("x", options=base, interval=0.2, sample=False)
    assert run.options == RunOptions(interval=0.2, sample=False, compare=False, warmup=3)
    assert (run.options.interval, run.options.sample) == (0.2, False)
    with pytest.raises(TypeError, match="unknown options: intervall"):
        Run("x", intervall=0.2)
    with pytest.raises(ValueError, match="at least 1"):
        Run("x", profile=0)
