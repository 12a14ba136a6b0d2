"""Building fresh DataLoaders like the user's and timing them: the torch side of the tuner.

Zero harm to the user's objects: a candidate loader is a new ``DataLoader`` over the same
dataset, with the same batch size, ``collate_fn``, ``worker_init_fn``, ``drop_last``,
``timeout`` and ``multiprocessing_context``, a sampler of the same kind (a new
``SequentialSampler``/``RandomSampler``; a custom sampler or batch sampler is shallow-copied)
and a *copy* of any ``torch.Generator`` (the user's generators are not advanced). The global
random states (torch, CUDA, ``random``, numpy) are restored after tuning, so the next training
run draws the same numbers as without it. The user's loader, its iterator and its persistent
workers are never touched. Every iterator is shut down in ``finally`` and every worker process
it started is checked gone (terminated, then killed, if it lingers), whatever ended the
measurement, ``KeyboardInterrupt`` included.
"""

from __future__ import annotations

import contextlib
import copy
import io
import multiprocessing
import pickle
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .candidates import Candidate, LoaderSpec
from .constants import TRAIN_SIDE_BATCHES, TRAIN_SIDE_PAUSE_FACTOR
from .predict import FAILED, MEASURED, Measurement

#: The longest pause taken to let batches queue up for the training-side measurement, s.
MAX_TRAIN_SIDE_PAUSE_S = 2.0
#: Seconds a worker process is given to exit after its iterator was shut down.
REAP_TIMEOUT_S = 5.0


def _clone_generator(gen: Any) -> Any:
    """A new ``torch.Generator`` in ``gen``'s state (``None`` stays ``None``)."""
    if gen is None:
        return None
    import torch

    twin = torch.Generator(device=gen.device)
    twin.set_state(gen.get_state())
    return twin


def _fresh_sampler(sampler: Any, dataset: Any) -> Any:
    """A sampler of ``sampler``'s kind over ``dataset`` that leaves ``sampler`` as it is."""
    from torch.utils.data import RandomSampler, SequentialSampler

    if type(sampler) is SequentialSampler:
        return SequentialSampler(dataset)
    if type(sampler) is RandomSampler:
        return RandomSampler(
            dataset,
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
            generator=_clone_generator(sampler.generator),
        )
    twin = copy.copy(sampler)
    if getattr(twin, "generator", None) is not None:
        with contextlib.suppress(Exception):
            twin.generator = _clone_generator(twin.generator)
    inner = getattr(twin, "sampler", None)  # a custom batch sampler over a sampler
    if inner is not None and inner is not sampler:
        with contextlib.suppress(Exception):
            twin.sampler = _fresh_sampler(inner, dataset)
    return twin


@dataclass
class LoaderSource:
    """What a candidate loader is built from: the user's loader's settings and objects."""

    loader: Any

    def __post_init__(self) -> None:
        from torch.utils.data import BatchSampler, IterableDataset

        ld = self.loader
        self.dataset = ld.dataset
        self.iterable = isinstance(ld.dataset, IterableDataset)
        batch_sampler = ld.batch_sampler
        #: the loader batches with torch's own BatchSampler over its sampler (batch_size=...)
        self.auto_batch = ld.batch_size is not None and type(batch_sampler) is BatchSampler
        self.custom_batch_sampler = batch_sampler is not None and not self.auto_batch

    @property
    def batches_per_epoch(self) -> int | None:
        try:
            return len(self.loader)
        except Exception:
            return None

    def start_method(self) -> str:
        """How worker processes start: the loader's ``multiprocessing_context``, else Python's."""
        ctx = self.loader.multiprocessing_context
        if isinstance(ctx, str):
            return ctx
        if ctx is not None:
            return str(ctx.get_start_method())
        return str(multiprocessing.get_start_method(allow_none=True) or _default_start_method())

    def build(self, candidate: Candidate) -> Any:
        """A new DataLoader with ``candidate``'s settings (``persistent_workers`` off: every
        measurement shuts its workers down)."""
        from torch.utils.data import DataLoader

        ld = self.loader
        workers = candidate.num_workers
        kwargs: dict[str, Any] = {
            "num_workers": workers,
            "collate_fn": ld.collate_fn,
            "pin_memory": candidate.pin_memory,
            "timeout": ld.timeout if workers else 0,
            "worker_init_fn": ld.worker_init_fn,
            "generator": _clone_generator(ld.generator),
            "pin_memory_device": getattr(ld, "pin_memory_device", ""),
        }
        if workers:
            kwargs["prefetch_factor"] = candidate.prefetch_factor
            kwargs["multiprocessing_context"] = ld.multiprocessing_context
        if self.iterable:
            kwargs.update(batch_size=ld.batch_size, drop_last=ld.drop_last)
        elif self.custom_batch_sampler:
            kwargs["batch_sampler"] = _fresh_sampler(ld.batch_sampler, self.dataset)
        else:
            kwargs.update(
                batch_size=ld.batch_size,
                drop_last=ld.drop_last,
                sampler=_fresh_sampler(ld.sampler, self.dataset),
            )
        with warnings.catch_warnings():  # more workers than CPUs is on purpose here
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            loader = DataLoader(self.dataset, **kwargs)
            if workers:
                loader.check_worker_number_rationality = lambda: None  # type: ignore[method-assign]
        return loader

    def spec(self, name_of: Callable[[Any], str | None], driver: str | None = None) -> LoaderSpec:
        """The loader's arguments as the paste line writes them; ``name_of`` gives an object's
        name in the notebook (None: unknown)."""
        from torch.utils.data import (
            BatchSampler,
            SequentialSampler,
            default_collate,
            default_convert,
        )

        ld = self.loader

        def name(obj: Any, fallback: str) -> str:
            return name_of(obj) or getattr(obj, "__name__", None) or fallback

        args: list[tuple[str, str]] = []
        batch_size, sampler, drop_last = ld.batch_size, ld.sampler, ld.drop_last
        batch_sampler = ld.batch_sampler
        own = type(batch_sampler) is BatchSampler
        if self.custom_batch_sampler and own:
            # torch's own, passed as batch_sampler=: accelerate's prepared loader (over a
            # SeedableRandomSampler where the user's shuffled), written as the user wrote it
            batch_size = batch_sampler.batch_size
            sampler, drop_last = batch_sampler.sampler, batch_sampler.drop_last
        elif self.custom_batch_sampler:
            args.append(("batch_sampler", name(batch_sampler, "batch_sampler")))
        if not self.custom_batch_sampler or own:
            args.append(("batch_size", repr(batch_size)))
            if not self.iterable:
                if _shuffles(sampler):
                    args.append(("shuffle", "True"))
                elif type(sampler) is not SequentialSampler:
                    args.append(("sampler", name(sampler, "sampler")))
            if drop_last:
                args.append(("drop_last", "True"))
        if ld.collate_fn not in (default_collate, default_convert):
            args.append(("collate_fn", name(ld.collate_fn, "collate_fn")))
        if ld.worker_init_fn is not None:
            args.append(("worker_init_fn", name(ld.worker_init_fn, "worker_init_fn")))
        if ld.generator is not None:
            args.append(("generator", name(ld.generator, "generator")))
        ctx = ld.multiprocessing_context
        if ctx is not None:
            args.append(("multiprocessing_context", repr(self.start_method())))
        if ld.timeout:
            args.append(("timeout", repr(ld.timeout)))
        return LoaderSpec(name(self.dataset, "dataset"), args, self.iterable, driver)


def _shuffles(sampler: Any) -> bool:
    """``sampler`` is what ``shuffle=True`` makes: a ``RandomSampler`` (or a subclass, as
    accelerate's ``SeedableRandomSampler``) drawing each sample once."""
    from torch.utils.data import RandomSampler

    return (
        isinstance(sampler, RandomSampler)
        and not sampler.replacement
        and sampler._num_samples is None
    )


def _default_start_method() -> str:
    return "fork" if sys.platform.startswith("linux") and sys.version_info < (3, 14) else "spawn"


class _Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return len(b)


def pickle_problem(source: LoaderSource) -> str | None:
    """Why workers cannot get the dataset (None: they can). Workers started by ``fork``
    inherit it; ``spawn`` and ``forkserver`` pickle the dataset, the ``collate_fn`` and the
    ``worker_init_fn`` (here into a sink that keeps nothing)."""
    method = source.start_method()
    if method == "fork":
        return None
    ld = source.loader
    for what, obj in (
        ("dataset", source.dataset),
        ("collate_fn", ld.collate_fn),
        ("worker_init_fn", ld.worker_init_fn),
    ):
        try:
            pickle.Pickler(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        except Exception as exc:
            return (
                f"the {what} cannot be pickled for workers started by {method!r} "
                f"({type(exc).__name__}: {exc}); only num_workers=0 was measured"
            )
    return None


@contextlib.contextmanager
def random_states() -> Iterator[None]:
    """Restore the global random states (torch, CUDA, ``random``, numpy) on exit: building and
    iterating loaders draws seeds from them."""
    import random

    import torch

    torch_state = torch.get_rng_state()
    py_state = random.getstate()
    np_mod = sys.modules.get("numpy")
    np_state = np_mod.random.get_state() if np_mod is not None else None
    cuda_states = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_states = torch.cuda.get_rng_state_all()
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(py_state)
        if np_mod is not None and np_state is not None:
            np_mod.random.set_state(np_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def batch_nbytes(batch: Any, _depth: int = 0) -> int:
    """Bytes of the tensors (and numpy arrays) in ``batch``, nested up to 4 levels."""
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if _depth >= 4:
        return 0
    if isinstance(batch, dict):
        return sum(batch_nbytes(v, _depth + 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v, _depth + 1) for v in batch)
    return 0


def worker_pids(it: Any) -> list[int]:
    return [w.pid for w in getattr(it, "_workers", []) if getattr(w, "pid", None)]


def shutdown(it: Any, pids: list[int]) -> None:
    """Shut ``it``'s workers down and make sure every one of ``pids`` is gone; a second
    ``KeyboardInterrupt`` while doing so does not stop it."""
    for _ in range(3):
        try:
            stop = getattr(it, "_shutdown_workers", None)
            if stop is not None:
                stop()
            break
        except KeyboardInterrupt:
            continue
        except Exception:
            break
    for _ in range(3):
        try:
            reap(pids)
            return
        except KeyboardInterrupt:
            continue


def reap(pids: list[int]) -> None:
    """Terminate, then kill, whichever of ``pids`` (our workers) still runs, and wait for it."""
    if not pids:
        return
    import psutil

    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, still = psutil.wait_procs(alive, timeout=REAP_TIMEOUT_S)
    for proc in still:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(still, timeout=REAP_TIMEOUT_S)
    for pid in pids:  # reap what multiprocessing did not join
        with contextlib.suppress(Exception):
            import os

            os.waitpid(pid, os.WNOHANG)


def _cpu_seconds(pids: list[int]) -> float | None:
    import psutil

    total = 0.0
    try:
        for pid in pids:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    except psutil.Error:
        return None
    return total


def measure_round(
    source: LoaderSource,
    m: Measurement,
    steady: int,
    *,
    deadline: float,
    batch_cap: int | None = None,
    consumer_ms: float | None = None,
) -> None:
    """Iterate a fresh loader of ``m``'s candidate and add ``steady`` batches' timing to
    ``m`` (fewer when the deadline, the epoch or ``batch_cap`` comes first). The first batch
    is the start-up (kept from the first round); with workers, the first round of batches
    (one per worker, produced together) is not timed. A candidate whose loader raises is
    marked failed with the reason. ``KeyboardInterrupt`` propagates after the cleanup.

    ``consumer_ms``: with workers, the first burst and each timed batch are followed by this
    much of the training process's CPU kept busy (the run's compute time per step, no model
    run), so that the workers share the CPUs and their queue is drained at the pace of the
    training, as in the run: a loader that keeps up only while nothing else runs, or whose
    queue is too short to absorb a late batch, shows it. (Without the wait after the burst, the
    first timed batch would wait for a worker still making it, which no step of the run does.)"""
    cand = m.candidate
    workers = cand.num_workers
    it: Any = None
    pids: list[int] = []
    reads = 0

    def may_read() -> bool:
        return batch_cap is None or reads < batch_cap

    def fetch() -> Any:
        nonlocal reads
        reads += 1
        return next(it)

    try:
        loader = source.build(cand)
        t0 = time.perf_counter()
        it = iter(loader)
        pids = worker_pids(it)
        batch = fetch()
        if m.startup_s is None:
            m.startup_s = time.perf_counter() - t0
        if m.batch_bytes is None:
            m.batch_bytes = batch_nbytes(batch)
        del batch
        for _ in range(max(workers - 1, 0)):  # the rest of the first burst
            if not may_read():
                break
            fetch()
        if workers:
            steady = -(-steady // workers) * workers  # whole rounds of the workers
            if consumer_ms:
                busy(consumer_ms / 1e3)
        cpu0 = _cpu_seconds(pids) if pids else None
        start = time.perf_counter()
        durations: list[float] = []
        last = start
        for _ in range(steady):
            if not may_read() or time.perf_counter() > deadline:
                break
            fetch()
            if workers and consumer_ms:
                busy(consumer_ms / 1e3)
            now = time.perf_counter()
            durations.append(now - last)
            last = now
        if not durations:
            if m.steady_batches == 0:
                m.status = FAILED
                m.reason = "no batch after the first could be timed (the epoch or the budget ended)"
            return
        wall = last - start
        if workers:
            m.steady_s += wall
        else:  # each fetch is the main process's own work: its median resists a pause
            m.steady_s += statistics.median(durations) * len(durations)
        m.steady_batches += len(durations)
        if pids:
            cpu1 = _cpu_seconds(pids)
            if cpu0 is not None and cpu1 is not None and wall > 0:
                m.worker_cpu_share = (cpu1 - cpu0) / (wall * workers)
                m.worker_cpu_ms_per_batch = (cpu1 - cpu0) * 1e3 / len(durations)
                m.worker_cpu_why = ""
            else:
                m.worker_cpu_why = "a worker's CPU time could not be read"
        elif workers:
            m.worker_cpu_why = "the workers' process ids are unknown"
        if workers:
            _measure_train_side(m, fetch, may_read, wall / len(durations), deadline)
        m.rounds += 1
        m.status = MEASURED
    except StopIteration:
        if m.steady_batches:
            m.rounds += 1
            m.status = MEASURED
        else:
            m.status = FAILED
            m.reason = "the loader ended before a batch after the first could be timed"
    except Exception as exc:
        m.status = FAILED
        m.reason = failure_reason(exc)
    finally:
        shutdown(it, pids)


def busy(seconds: float) -> None:
    """Keep this thread on the CPU for ``seconds`` of wall time, as a training step does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def failure_reason(exc: BaseException) -> str:
    """One line: ``RuntimeError: ...``; an error torch re-raises from a worker reads
    ``in DataLoader worker process 0: RuntimeError: <the worker's own message>``."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if len(lines) > 1 and "DataLoader worker" in lines[0]:
        where = lines[0].removeprefix("Caught ").rstrip(".")
        return f"{where}: {lines[-1]}"
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _measure_train_side(
    m: Measurement,
    fetch: Callable[[], Any],
    may_read: Callable[[], bool],
    between_s: float,
    deadline: float,
) -> None:
    """Time taking batches that are already waiting: pause until a few have queued up, then
    time ``TRAIN_SIDE_BATCHES`` fetches (at most the batches the candidate keeps in flight)."""
    count = min(TRAIN_SIDE_BATCHES, m.candidate.in_flight)
    pause = min(TRAIN_SIDE_PAUSE_FACTOR * count * between_s, MAX_TRAIN_SIDE_PAUSE_S)
    if time.perf_counter() + pause > deadline:
        return
    time.sleep(pause)
    taken = []
    for _ in range(count):
        if not may_read():
            break
        t = time.perf_counter()
        fetch()
        taken.append(time.perf_counter() - t)
    m.train_side_samples.extend(t * 1e3 for t in taken)
