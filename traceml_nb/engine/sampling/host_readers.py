"""Reading the host's counters: this process's and its children's CPU times and memory, each
core's times, the machine's RAM; from ``/proc`` directly on Linux (:class:`ProcfsReader`, for
the overhead budget), elsewhere through psutil (:class:`PsutilReader`). The sampler
(:mod:`.host`) turns these cumulative counters into the shares it records.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple


def proc_children_pids(pid: int, proc_root: Path = Path("/proc")) -> list[int] | None:
    """All descendants of ``pid`` from Linux's ``/proc/<pid>/task/<tid>/children`` files.

    Reads a handful of small files instead of scanning every process on the machine (what
    psutil's ``children()`` does). None where those files do not exist (not Linux, or a kernel
    without ``CONFIG_PROC_CHILDREN``).
    """
    if not (proc_root / str(pid) / "task").is_dir():
        return None
    found: list[int] = []
    todo = [pid]
    seen = {pid}
    first = True
    while todo:
        current = todo.pop()
        try:
            tasks = list((proc_root / str(current) / "task").iterdir())
        except OSError:
            continue  # the process ended
        for task in tasks:
            try:
                text = (task / "children").read_text()
            except FileNotFoundError:
                if first:
                    return None  # this kernel has no children files
                continue
            except OSError:
                continue
            first = False
            for word in text.split():
                child = int(word)
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    todo.append(child)
        first = False
    return found


def cpus_available() -> int | None:
    """CPUs this process may run on: its affinity mask where the OS has one, else all CPUs."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return len(affinity(0))
        except OSError:
            pass
    return os.cpu_count()


#: Process start times have the resolution of a kernel clock tick (10 ms on most systems).
START_TIME_RESOLUTION_S = 0.01


class ProcessGone(Exception):
    """The process ended (or its pid now belongs to another process)."""


class CoreTime(NamedTuple):
    """One CPU's cumulative counters (seconds or clock ticks, one unit per reader)."""

    busy: float  #: time not idle (user, system, interrupts... and steal)
    total: float  #: all of it: busy + idle + iowait
    steal: float | None  #: time the hypervisor took (inside ``busy``); None: not reported


class ProcStat(NamedTuple):
    cpu_s: float  #: user + system CPU seconds of the process itself (not of reaped children)
    rss_bytes: int
    started: float  #: start time, on the reader's :meth:`now` clock (s)
    #: seconds its main thread was ready to run but waited for a CPU (the run queue's wait,
    #: ``/proc/<pid>/schedstat``); None where not read or not reported
    cpu_wait_s: float | None = None


class ProcfsReader:
    """Linux: reads ``/proc`` directly, one open/read/close per file.

    psutil's buffered reads (about 7 system calls a file) and parsing cost several times as
    much a sample; this keeps the sampler inside its 1%-of-a-core budget.
    Start times are compared on ``CLOCK_BOOTTIME``, the clock ``/proc/<pid>/stat`` uses.
    """

    def __init__(self, psutil: Any = None, proc_root: str = "/proc") -> None:
        self._root = proc_root
        self._psutil = psutil
        self._tick = float(os.sysconf("SC_CLK_TCK"))
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._use_children_files = True
        #: why ``ProcStat.cpu_wait_s`` is None from this reader ('' where it is read)
        self.no_wait_reason = ""
        try:
            self._read(f"{proc_root}/{os.getpid()}/schedstat")
        except OSError:
            self.no_wait_reason = (
                "this kernel has no /proc/<pid>/schedstat (built without CONFIG_SCHED_INFO)"
            )
        self.process_stat(os.getpid())  # fails here, not mid-run, where /proc is not Linux's
        self.core_times()
        self.memory()

    def _read(self, path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            chunks: list[bytes] = []
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            os.close(fd)

    def now(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def process_stat(self, pid: int, rss: bool = True, wait: bool = False) -> ProcStat:
        """``wait``: read the run queue's wait too (one more file)."""
        try:
            raw = self._read(f"{self._root}/{pid}/stat")
            waited = None
            if wait and not self.no_wait_reason:
                # man 5 proc: time on the CPU, time waiting on a run queue (ns), timeslices
                waited = int(self._read(f"{self._root}/{pid}/schedstat").split()[1]) / 1e9
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        fields = raw[raw.rindex(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        # man 5 proc, fields 14/15 (utime, stime), 22 (starttime), 24 (rss), counted from 1
        cpu_ticks = int(fields[11]) + int(fields[12])
        return ProcStat(
            cpu_ticks / self._tick,
            int(fields[21]) * self._page,
            int(fields[19]) / self._tick,
            waited,
        )

    #: Why ``CoreTime.steal`` is None from this reader.
    no_steal_reason = "this kernel's /proc/stat has no steal time column (a kernel before 2.6.11)"

    def core_times(self) -> list[CoreTime]:
        cores = []
        for line in self._read(f"{self._root}/stat").splitlines():
            if line.startswith(b"cpu") and line[3:4].isdigit():
                # user nice system idle iowait irq softirq steal guest guest_nice (clock ticks);
                # guest time is already inside user/nice, as psutil counts it
                v = [int(x) for x in line.split()[1:]]
                total = sum(v[:8])
                idle = v[3] + (v[4] if len(v) > 4 else 0)
                steal = float(v[7]) if len(v) > 7 else None
                cores.append(CoreTime(float(total - idle), float(total), steal))
            elif cores:
                break
        return cores

    def memory(self) -> tuple[int, int]:
        info = {}
        for line in self._read(f"{self._root}/meminfo").splitlines():
            key, _, rest = line.partition(b":")
            info[key] = int(rest.split()[0]) * 1024
        total = info[b"MemTotal"]
        available = info.get(b"MemAvailable")
        if available is None:  # kernels before 3.14
            available = info[b"MemFree"] + info.get(b"Buffers", 0) + info.get(b"Cached", 0)
        return total, available

    def main_thread_children(self, pid: int) -> list[int] | None:
        """Direct children forked by the main thread of ``pid`` (None where not readable)."""
        if not self._use_children_files:
            return None
        try:
            return [int(w) for w in self._read(f"{self._root}/{pid}/task/{pid}/children").split()]
        except OSError:
            return None

    def children(self, pid: int) -> list[int] | None:
        if self._use_children_files:
            pids = proc_children_pids(pid, Path(self._root))
            if pids is not None:
                return pids
            self._use_children_files = False
        return _psutil_children(self._psutil, pid)


class PsutilReader:
    """Any OS psutil supports (macOS, Windows, Linux without the fast path)."""

    def __init__(self, psutil: Any) -> None:
        self._psutil = psutil
        self._processes: dict[int, Any] = {}
        # On Linux psutil's create_time() is the boot time (whole seconds!) plus the start
        # ticks: up to a second off against time.time(), exact against CLOCK_BOOTTIME.
        self._boot_time = 0.0
        self._now: Callable[[], float] = time.time
        if sys.platform.startswith("linux"):
            self._boot_time = float(psutil.boot_time())
            self._now = lambda: time.clock_gettime(time.CLOCK_BOOTTIME)

    def now(self) -> float:
        return self._now()

    def _process(self, pid: int) -> Any:
        proc = self._processes.get(pid)
        if proc is None:
            proc = self._processes[pid] = self._psutil.Process(pid)
        return proc

    #: Why ``ProcStat.cpu_wait_s`` is None from this reader.
    no_wait_reason = "only Linux reports a process's wait for a CPU (/proc/<pid>/schedstat)"

    def process_stat(self, pid: int, rss: bool = True, wait: bool = False) -> ProcStat:
        try:
            proc = self._process(pid)
            times = proc.cpu_times()
            rss_bytes = proc.memory_info().rss if rss else 0
            started = float(proc.create_time()) - self._boot_time
            return ProcStat(float(times.user + times.system), rss_bytes, started)
        except self._psutil.Error as exc:
            self._processes.pop(pid, None)
            raise ProcessGone(pid) from exc

    @property
    def no_steal_reason(self) -> str:
        """Why ``CoreTime.steal`` is None from this reader."""
        return f"psutil reports no steal time on this platform ({sys.platform}): only Linux has it"

    def core_times(self) -> list[CoreTime]:
        cores = []
        for t in self._psutil.cpu_times(percpu=True):
            total = float(sum(t)) - float(getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0))
            idle = float(t.idle + getattr(t, "iowait", 0.0))
            steal = getattr(t, "steal", None)  # Linux only (psutil's field list per platform)
            cores.append(CoreTime(total - idle, total, None if steal is None else float(steal)))
        return cores

    def memory(self) -> tuple[int, int]:
        mem = self._psutil.virtual_memory()
        return int(mem.total), int(mem.available)

    def main_thread_children(self, pid: int) -> list[int] | None:
        return None  # no cheap way: new children wait for the next full refresh

    def children(self, pid: int) -> list[int] | None:
        pids = _psutil_children(self._psutil, pid)
        if pids is not None:  # forget the processes that ended
            alive = set(pids)
            for gone in [p for p in self._processes if p not in alive and p != pid]:
                del self._processes[gone]
        return pids


def _psutil_children(psutil: Any, pid: int) -> list[int] | None:
    if psutil is None:
        return None
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return None


HostReader = ProcfsReader | PsutilReader


def make_reader(psutil: Any) -> HostReader:
    """The fast ``/proc`` reader on Linux, else psutil's (``psutil`` None: Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            return ProcfsReader(psutil)
        except (OSError, ValueError, IndexError, KeyError):
            pass  # an unusual /proc (a sandbox): psutil copes
    if psutil is None:
        raise RuntimeError("psutil is not installed and /proc cannot be read")
    return PsutilReader(psutil)
