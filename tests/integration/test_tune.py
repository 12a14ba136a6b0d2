"""The tuner on real DataLoaders over sleepy datasets: harm to nothing of the user's, every
worker process gone however it ends (a real SIGINT included), the memory guard, iterable
and unpicklable datasets, workers that fail, the batch cap and the budget."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, get_worker_info

from traceml_nb.tune import tune
from traceml_nb.tune.candidates import Candidate
from traceml_nb.tune.constants import FIRST_ROUND_BATCHES, RAM_SHARE
from traceml_nb.tune.predict import FAILED, MEASURED, SKIPPED
from traceml_nb.tune.tuner import SHARDING_NOTE


class SleepyDataset(Dataset):
    """Each item sleeps ``sleep_s`` (slow storage) and costs almost no CPU."""

    def __init__(self, n: int = 256, sleep_s: float = 0.002) -> None:
        self.n, self.sleep_s = n, sleep_s
        self.reads = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.reads += 1  # counted in the process that reads (the main one without workers)
        time.sleep(self.sleep_s)
        return torch.randn(16), i % 2


class SleepyStream(IterableDataset):
    """An iterable dataset that shards itself across workers."""

    def __init__(self, n: int = 512, sleep_s: float = 0.002) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, self.n, step):
            time.sleep(self.sleep_s)
            yield torch.randn(16), i % 2


class LockedDataset(SleepyDataset):
    """Holds a lock: it cannot be pickled for workers started by spawn."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


class NoWorkersDataset(SleepyDataset):
    """Fails inside a worker process (say, a connection that does not survive a fork)."""

    def __getitem__(self, i: int):
        if get_worker_info() is not None:
            raise RuntimeError("the database connection is not usable in a worker")
        return super().__getitem__(i)


def children_gone(grace_s: float = 5.0) -> list[psutil.Process]:
    """This process's child processes still alive after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_workers_or_threads_left():
    assert children_gone(0) == []
    threads = {t.ident for t in threading.enumerate()}
    yield
    assert children_gone() == []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t.ident not in threads and t.is_alive()]
        if not extra:
            break
        time.sleep(0.05)
    assert extra == [], [t.name for t in extra]


def by_candidate(result):
    return {m.candidate: m for m in result.measurements}


def test_the_line_to_paste_writes_the_loader_as_its_user_wrote_it():
    """A loader accelerate prepared batches with torch's BatchSampler passed as
    ``batch_sampler=`` (over a ``SeedableRandomSampler`` where the user shuffled): written as
    the user's ``batch_size=16, shuffle=True`` (it read ``batch_sampler=batch_sampler``, a name
    the notebook has not); a batch sampler of one's own, or a sampler that draws with
    replacement, by its name; ``batch_size=None`` kept."""
    from accelerate import Accelerator
    from torch.utils.data import BatchSampler, RandomSampler

    from traceml_nb.tune.measure import LoaderSource

    data = TensorDataset(torch.randn(64, 4))

    def spec(loader):
        return LoaderSource(loader).spec({id(data): "data"}.get).arguments

    prepared = Accelerator(cpu=True).prepare(DataLoader(data, batch_size=16, shuffle=True))
    assert spec(prepared) == [("batch_size", "16"), ("shuffle", "True")]
    dropped = DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), 16, True))
    assert spec(dropped) == [("batch_size", "16"), ("shuffle", "True"), ("drop_last", "True")]

    class Buckets(BatchSampler):
        pass

    own = DataLoader(data, batch_sampler=Buckets(RandomSampler(data), 16, False))
    assert spec(own) == [("batch_sampler", "batch_sampler")]
    drawn = DataLoader(data, batch_size=8, sampler=RandomSampler(data, replacement=True))
    assert spec(drawn) == [("batch_size", "8"), ("sampler", "sampler")]
    assert spec(DataLoader(data, batch_size=None)) == [("batch_size", "None")]


def test_the_users_loader_generator_and_random_state_are_untouched(tmp_path):
    calls = []

    def collate(batch):
        calls.append(len(batch))
        return torch.utils.data.default_collate(batch)

    def init(worker_id):
        (tmp_path / f"worker-{os.getpid()}").write_text(str(worker_id))

    gen = torch.Generator().manual_seed(7)
    dataset = SleepyDataset(96)
    loader = DataLoader(
        dataset, batch_size=4, shuffle=True, collate_fn=collate, worker_init_fn=init, generator=gen
    )
    before = dict(vars(loader))
    gen_state, rng_state = gen.get_state(), torch.get_rng_state()
    result = tune(loader, compute_ms=2.0, workers=[0, 1], budget_s=10, gpu=False)
    assert result.status == "completed"
    assert {m.status for m in result.measurements} <= {MEASURED, "dropped"}
    assert torch.equal(gen.get_state(), gen_state)  # the user's generator was copied
    assert torch.equal(torch.get_rng_state(), rng_state)  # the global state restored
    assert dict(vars(loader)) == before  # nothing set or replaced on the user's loader
    assert loader._iterator is None
    assert calls and set(calls) == {4}  # the user's collate_fn made the batches (in-process)
    assert list(tmp_path.glob("worker-*"))  # ...and the worker_init_fn ran in the workers
    assert result.paste.startswith("DataLoader(dataset, batch_size=4, shuffle=True")
    assert "collate_fn=collate" in result.paste and "worker_init_fn=init" in result.paste


def test_a_real_sigint_stops_it_with_the_results_so_far_and_no_worker_left():
    loader = DataLoader(SleepyDataset(400, sleep_s=0.02), batch_size=8)  # 160 ms a batch
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    started = time.perf_counter()
    timer.start()
    try:
        result = tune(loader, compute_ms=5.0, budget_s=60, gpu=False)
    except KeyboardInterrupt:  # pragma: no cover - what the test exists to catch
        pytest.fail("the interrupt escaped the tuner")
    finally:
        timer.cancel()
    elapsed = time.perf_counter() - started
    assert result.status == "interrupted"
    assert elapsed < 30  # it stopped at the interrupt (2 s in), far from its 60 s budget
    assert any(m.status == MEASURED for m in result.measurements)  # the results so far
    assert any(m.reason == "interrupted" for m in result.measurements)
    assert result.recommended is not None
    assert "interrupted" in result.notes[0]


def test_memory_guard_skips_a_candidate_past_the_ram_share_and_says_why():
    loader = DataLoader(SleepyDataset(), batch_size=8)
    batch_bytes = 8 * 16 * 4 + 8 * 8  # 8 float vectors of 16, 8 int64 labels
    # 2 workers × prefetch 2 = 4 batches in flight are just too many; 1 worker's 2 just fit
    ram = int(4 * batch_bytes / RAM_SHARE) - 1
    assert 2 * batch_bytes <= RAM_SHARE * ram
    result = tune(
        loader,
        compute_ms=1.0,
        workers=[0, 1, 2],
        prefetch=[2],
        budget_s=10,
        gpu=False,
        ram_available=ram,
    )
    got = by_candidate(result)
    assert got[Candidate(0)].batch_bytes == batch_bytes
    assert got[Candidate(2, 2)].status == SKIPPED
    assert "4 batches in flight would take" in got[Candidate(2, 2)].reason
    assert "of RAM available" in got[Candidate(2, 2)].reason
    assert got[Candidate(1, 2)].status == MEASURED
    assert result.recommended in (Candidate(0), Candidate(1, 2))


def test_iterable_dataset_tunes_num_workers_only_and_states_the_sharding_caveat():
    loader = DataLoader(SleepyStream(), batch_size=8)
    result = tune(loader, compute_ms=1.0, workers=[0, 1, 2], budget_s=10, gpu=False)
    assert result.status == "completed"
    assert {m.candidate.prefetch_factor for m in result.measurements} <= {None, 2}
    assert any(m.status == MEASURED and m.candidate.num_workers for m in result.measurements)
    assert SHARDING_NOTE in result.notes
    assert result.paste.startswith("DataLoader(dataset, batch_size=8")
    assert "shuffle" not in result.paste


def test_an_unpicklable_dataset_gets_a_reason_not_a_crash():
    loader = DataLoader(
        LockedDataset(), batch_size=8, num_workers=2, multiprocessing_context="spawn"
    )
    result = tune(loader, compute_ms=1.0, workers=[0, 1, 2], budget_s=10, gpu=False)
    got = by_candidate(result)
    for cand, m in got.items():
        if cand.num_workers:
            assert m.status == SKIPPED
            assert "cannot be pickled for workers started by 'spawn'" in m.reason
            assert "lock" in m.reason
    assert got[Candidate(0)].status == MEASURED
    assert result.recommended == Candidate(0)
    assert any("cannot be pickled" in note for note in result.notes)
    assert "multiprocessing_context='spawn'" in result.paste


def test_workers_that_fail_are_reported_and_the_others_still_measured():
    loader = DataLoader(NoWorkersDataset(), batch_size=8)
    result = tune(loader, compute_ms=1.0, workers=[0, 1], budget_s=10, gpu=False)
    got = by_candidate(result)
    assert got[Candidate(1, 2)].status == FAILED
    assert got[Candidate(1, 2)].reason == (
        "RuntimeError in DataLoader worker process 0: "
        "RuntimeError: the database connection is not usable in a worker"
    )
    assert got[Candidate(0)].status == MEASURED
    assert result.recommended == Candidate(0)


def test_batches_caps_what_is_read_per_candidate():
    dataset = SleepyDataset(256, sleep_s=0.0)
    result = tune(DataLoader(dataset, batch_size=4), workers=[0], batches=3, budget_s=10)
    assert result.measurements[0].status == MEASURED
    assert dataset.reads <= 3 * 4  # one candidate, one round, 3 batches of 4
    assert result.batches_cap == 3


def test_the_budget_bounds_it_and_says_when_it_cut_the_measurements_short():
    loader = DataLoader(SleepyDataset(400, sleep_s=0.02), batch_size=8)  # 160 ms a batch
    budget = 4.0  # the first round's half, shared by 4 candidates: ~3 batches each
    result = tune(loader, compute_ms=5.0, budget_s=budget, gpu=False, workers=[0, 1, 2, 3])
    # a candidate stops at its share of the deadline; what overruns it is one fetch, the
    # start-up of its workers and their shutdown
    assert result.elapsed_s < budget + 5.0
    measured = [m for m in result.measurements if m.steady_batches]
    assert measured and any(m.steady_batches < FIRST_ROUND_BATCHES for m in measured)
    assert any("the budget (4 s) left" in note for note in result.notes)
    assert result.recommended is not None


def test_a_budget_too_short_for_any_batch_fails_with_the_reason():
    loader = DataLoader(SleepyDataset(400, sleep_s=0.05), batch_size=8)  # 400 ms a batch
    result = tune(loader, compute_ms=5.0, budget_s=0.5, gpu=False, workers=[0, 1])
    assert result.status == "failed" and result.recommended is None
    assert result.notes[0].startswith("nothing could be measured: ")
    assert result.headline().startswith("no recommendation: nothing could be measured")


def test_a_dead_weak_proxy_among_the_live_objects_does_not_stop_the_search():
    """gc.get_objects() can hold a weakref.proxy whose object is gone: any look at it raises
    ReferenceError (seen in a full test run). The search passes over it."""
    import gc
    import weakref

    from traceml_nb.tune.find import find_loader

    class Gone:
        pass

    target = Gone()
    proxy = weakref.proxy(target)
    del target
    gc.collect()
    assert any(o is proxy for o in gc.get_objects()), "the proxy is not among the live objects"
    data = TensorDataset(torch.randn(16, 2), torch.zeros(16))
    loader = DataLoader(data, batch_size=4)
    info = {"dataset_id": id(data), "dataset_type": "TensorDataset", "batch_size": 4}
    with pytest.raises(ReferenceError):
        isinstance(proxy, DataLoader)
    assert find_loader(info, {}) == (loader, None)
