"""The host sample source (psutil): this process, its worker processes, the machine's CPUs, RAM.

This is what tells "too few DataLoader workers" (workers busy, cores idle) from "CPU saturated
by decoding" (every core busy). Columns (``None``/NaN = unavailable):

======================== ==============================================================
``proc_cpu_pct``         CPU used by this (the training) process; 100 = one core fully busy
``workers_cpu_pct``      CPU used by its DataLoader workers, all together; 100 = one core
``workers``              number of DataLoader workers alive
``workers_cpu_wait_pct`` time the workers were ready to run but waited for a CPU, summed (their
                         main threads' run-queue wait); 100 = one worker waiting all the time;
                         unavailable (``CPU_WAIT_CAPABILITY``'s reason) off Linux
``sys_cpu_pct``          whole-machine CPU use, 0..100 (100 = every core busy); steal time counts
                         as busy, since a CPU the hypervisor took could not run this machine's work
``steal_pct``            steal time: the share of the machine's CPU time the hypervisor gave to
                         other guests while this (virtual) machine wanted to run, 0..100 of all its
                         CPUs' time; unavailable (NaN, with ``STEAL_CAPABILITY``'s reason) where the
                         kernel reports no steal time (macOS, Windows)
``max_core_pct``         busiest core usable by this process (0..100)
``cores_saturated``      cores usable by this process that were more than 90% busy
``ram_used_mb``          machine RAM in use: total minus available (MiB)
``ram_total_mb``         machine RAM (MiB)
``proc_rss_mb``          resident memory of this process (MiB)
``cpus_available``       CPUs this process may run on (its affinity mask)
======================== ==============================================================

The workers are the child processes the run was told are a DataLoader's (``worker_pids``, from
:attr:`~..instrument.tracer.StepTracer.worker_pids`); other children of the training process
are none of theirs: the W&B service ``wandb.init()`` starts beside a notebook's kernel, a compile
worker, a rank, an evaluation's persistent workers beside a training loader's. A source told
nothing counts every child.

All CPU figures are averages over the time since the previous sample that had them (at
least ``MIN_CPU_INTERVAL_S``: the counters tick every 10 ms), computed from the kernel's
cumulative CPU-time counters (never psutil's module-global ``cpu_percent`` state,
which the user's own code may share). On Linux they are read from ``/proc`` directly
(:class:`~.host_readers.ProcfsReader`, for the overhead budget), elsewhere through psutil
(:class:`~.host_readers.PsutilReader`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Container

from ..capabilities import Capabilities
from ..record import SampleTable
from .host_readers import (
    START_TIME_RESOLUTION_S,
    CoreTime,
    HostReader,
    ProcessGone,
    cpus_available,
    make_reader,
)

COLUMNS = (
    "proc_cpu_pct",
    "workers_cpu_pct",
    "workers",
    "workers_cpu_wait_pct",
    "sys_cpu_pct",
    "steal_pct",
    "max_core_pct",
    "cores_saturated",
    "ram_used_mb",
    "ram_total_mb",
    "proc_rss_mb",
    "cpus_available",
)

MIB = 1024 * 1024
SATURATED_PCT = 90.0  #: a core busier than this counts as saturated
CHILDREN_REFRESH_S = 1.0  #: the list of child processes is rebuilt at most this often
#: CPU figures need an interval at least this long (s): the kernel counts CPU time in ticks of
#: 10 ms, so over the ~17 ms between the start and a run's first sample a busy process could
#: read 0% and the machine 100% (or 0%). A shorter interval leaves them unavailable, and the
#: next sample covers it.
MIN_CPU_INTERVAL_S = 0.05
#: The capability that says whether ``steal_pct`` is measured, and why not.
STEAL_CAPABILITY = "steal_time"
#: ...and whether ``workers_cpu_wait_pct`` is.
CPU_WAIT_CAPABILITY = "cpu_wait"


class _Tracked:
    """A child process: its start time (to notice pid reuse), CPU seconds and seconds waiting
    for a CPU at the last sample."""

    __slots__ = ("started", "last_cpu_s", "last_wait_s")

    def __init__(self, started: float, last_cpu_s: float, last_wait_s: float) -> None:
        self.started = started
        self.last_cpu_s = last_cpu_s
        self.last_wait_s = last_wait_s


class HostSource:
    """Samples this process, its child processes and the machine (see the module docstring)."""

    name = "host"

    def __init__(
        self,
        reader: HostReader,
        *,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        children_refresh_s: float = CHILDREN_REFRESH_S,
        worker_pids: Container[int] | None = None,
    ) -> None:
        self.table = SampleTable(COLUMNS)
        self._worker_pids = worker_pids
        self.reader = reader
        self._pid = os.getpid() if pid is None else pid
        self._clock = clock
        self._refresh_s = children_refresh_s
        self._cpus_available = cpus_available()
        self._children: dict[int, _Tracked] = {}
        self._children_ok = True
        self._last_refresh = -float("inf")
        self._last_t = clock()
        self._last_start_clock = reader.now()
        self._last_proc_cpu_s = reader.process_stat(self._pid, rss=False).cpu_s
        self._last_cores = reader.core_times()
        #: why ``steal_pct`` is unavailable ('' when this machine's kernel reports steal time)
        self.steal_why = ""
        if not self._last_cores or any(c.steal is None for c in self._last_cores):
            self.steal_why = reader.no_steal_reason
        self._usable_cores = self._usable_core_indices(len(self._last_cores))
        self._refresh_children(self._last_t, prime_all=True)

    @staticmethod
    def _usable_core_indices(n_cores: int) -> list[int] | None:
        """Indices into the per-core list of the cores this process may use (None = all)."""
        affinity = getattr(os, "sched_getaffinity", None)
        if affinity is None or n_cores != os.cpu_count():
            return None  # CPUs offline: list positions are not CPU numbers
        try:
            return sorted(affinity(0))
        except OSError:
            return None

    # --- child processes ----------------------------------------------------------------------
    def _refresh_children(self, now: float, prime_all: bool = False) -> None:
        self._last_refresh = now
        pids = self.reader.children(self._pid)
        if pids is None:
            self._children_ok = False
            self._children.clear()
            return
        self._children_ok = True
        current = set(pids)
        for pid in list(self._children):
            if pid not in current:
                del self._children[pid]
        for pid in pids:
            if pid not in self._children and self._is_worker(pid):
                self._track(pid, prime_all)

    def _is_worker(self, pid: int) -> bool:
        return self._worker_pids is None or pid in self._worker_pids

    def _track(self, pid: int, prime: bool = False) -> None:
        try:
            stat = self.reader.process_stat(pid, rss=False, wait=True)
        except ProcessGone:
            return  # ended before we could look at it
        # A child started since the previous sample spent all its CPU time inside this
        # interval: count it from 0. An older one (found late) is counted from now on.
        if stat.started >= self._last_start_clock - START_TIME_RESOLUTION_S and not prime:
            self._children[pid] = _Tracked(stat.started, 0.0, 0.0)
        else:
            self._children[pid] = _Tracked(stat.started, stat.cpu_s, stat.cpu_wait_s or 0.0)

    def _track_new_main_thread_children(self) -> None:
        """Between full refreshes, pick up new children of the main thread (one small read):
        DataLoader workers are forked there, and found a second late they would lose that
        second of CPU time."""
        pids = self.reader.main_thread_children(self._pid)
        for pid in pids or ():
            if pid not in self._children and self._is_worker(pid):
                self._track(pid)

    def _children_cpu_s(self, advance: bool = True) -> tuple[float, float | None]:
        """CPU seconds the children used since the previous sample, and seconds they waited
        for a CPU (None: not reported); ended children are dropped, and those no longer
        counted as workers. ``advance=False`` only drops them: the next call counts from
        where this one would have."""
        used = waited = 0.0
        wait_known = not self.reader.no_wait_reason
        for pid, tracked in list(self._children.items()):
            if not self._is_worker(pid):  # no longer: an evaluation's, once a loader trains
                del self._children[pid]
                continue
            try:
                stat = self.reader.process_stat(pid, rss=False, wait=wait_known)
            except ProcessGone:
                stat = None
            if stat is None or abs(stat.started - tracked.started) > START_TIME_RESOLUTION_S:
                del self._children[pid]  # ended (its last slice is lost) or pid reused
                continue
            if not advance:
                continue
            used += max(0.0, stat.cpu_s - tracked.last_cpu_s)
            tracked.last_cpu_s = stat.cpu_s
            if stat.cpu_wait_s is not None:
                waited += max(0.0, stat.cpu_wait_s - tracked.last_wait_s)
                tracked.last_wait_s = stat.cpu_wait_s
        return used, waited if wait_known else None

    # --- sampling ---------------------------------------------------------------------------
    def read(self) -> dict[str, float | int | None]:
        """One sample: CPU averages since the previous sample that had them (left unavailable
        for an interval shorter than ``MIN_CPU_INTERVAL_S``, which the next sample then
        covers), memory as it is now."""
        reader = self.reader
        now = self._clock()
        elapsed = now - self._last_t
        values: dict[str, float | int | None] = dict.fromkeys(COLUMNS)
        values["cpus_available"] = self._cpus_available

        me = reader.process_stat(self._pid)
        if now - self._last_refresh >= self._refresh_s:
            self._refresh_children(now)
        elif self._children_ok:
            self._track_new_main_thread_children()
        cpu_due = elapsed >= MIN_CPU_INTERVAL_S
        children_cpu_s, children_wait_s = (
            self._children_cpu_s(advance=cpu_due) if self._children_ok else (None, None)
        )
        if self._children_ok:
            values["workers"] = len(self._children)
        total, available = reader.memory()
        values["ram_total_mb"] = total / MIB
        values["ram_used_mb"] = (total - available) / MIB
        values["proc_rss_mb"] = me.rss_bytes / MIB
        if not cpu_due:
            return values

        cores = reader.core_times()
        values["proc_cpu_pct"] = max(0.0, me.cpu_s - self._last_proc_cpu_s) / elapsed * 100
        if children_cpu_s is not None and (self._children or children_cpu_s > 0):
            # no child process: nothing to read, which is not a 0% reading
            values["workers_cpu_pct"] = children_cpu_s / elapsed * 100
            if children_wait_s is not None:
                values["workers_cpu_wait_pct"] = children_wait_s / elapsed * 100
        values.update(self._core_stats(cores))

        self._last_t = now
        self._last_start_clock = reader.now()
        self._last_proc_cpu_s = me.cpu_s
        self._last_cores = cores
        return values

    def _core_stats(self, cores: list[CoreTime]) -> dict[str, float | int | None]:
        if len(cores) != len(self._last_cores):  # a CPU went on- or offline
            return {}
        pcts: list[float | None] = []
        busy_sum = total_sum = steal_sum = 0.0
        steal_known = not self.steal_why
        for now, last in zip(cores, self._last_cores, strict=True):
            d_busy, d_total = now.busy - last.busy, now.total - last.total
            busy_sum += max(0.0, d_busy)
            total_sum += max(0.0, d_total)
            if now.steal is None or last.steal is None:
                steal_known = False
            elif steal_known:
                steal_sum += max(0.0, now.steal - last.steal)
            pcts.append(min(100.0, max(0.0, d_busy / d_total * 100)) if d_total > 0 else None)
        if total_sum <= 0:
            return {}  # the counters have not moved yet (samples closer than a clock tick)
        usable = pcts if self._usable_cores is None else [pcts[i] for i in self._usable_cores]
        known = [p for p in usable if p is not None]
        return {
            "sys_cpu_pct": min(100.0, busy_sum / total_sum * 100),
            # of the whole machine's CPU time, as sys_cpu_pct (which holds it), so the two subtract
            "steal_pct": min(100.0, steal_sum / total_sum * 100) if steal_known else None,
            "max_core_pct": max(known) if known else None,
            "cores_saturated": sum(1 for p in known if p > SATURATED_PCT) if known else None,
        }

    def close(self) -> None:
        self._children.clear()


def open_host_source(
    capabilities: Capabilities, worker_pids: Container[int] | None = None
) -> HostSource | None:
    """The host source with its CPU counters primed, or None with the reason in capabilities;
    ``worker_pids``: the DataLoader workers' process ids as the run learns them."""
    try:
        import psutil
    except ImportError:
        psutil = None  # Linux reads /proc without it
    try:
        source = HostSource(make_reader(psutil), worker_pids=worker_pids)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if psutil is None:
            reason = "psutil is not installed"
        capabilities.set("host", False, f"host CPU and RAM are not sampled: {reason}")
        capabilities.set(STEAL_CAPABILITY, False, capabilities.why("host"))
        capabilities.set(CPU_WAIT_CAPABILITY, False, capabilities.why("host"))
        return None
    capabilities.set("host", True)
    capabilities.set(STEAL_CAPABILITY, not source.steal_why, source.steal_why)
    wait_why = source.reader.no_wait_reason
    capabilities.set(CPU_WAIT_CAPABILITY, not wait_why, wait_why)
    return source
