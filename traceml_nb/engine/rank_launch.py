"""Ranks launched from a run: each child process runs its own engine and streams its step rows
to the kernel over a local pipe.

While a :class:`~traceml_nb.engine.run.Run` is measuring, ``torch.multiprocessing.spawn`` and
``start_processes`` (:mod:`.instrument.ranks`) start every rank's ``fn`` wrapped by
:class:`RankLaunch`, a picklable object of this module. In the child it starts a
:class:`~traceml_nb.engine.run.Run` of its own (no samplers, no CUDA: the rank's device is its own
business), calls ``fn`` unchanged, and stops that run however ``fn`` ends, so the
instrumentation lives exactly as long as ``fn``. A daemon thread of the child sends the new
rows every :data:`SEND_INTERVAL_S` seconds, and the rest when ``fn`` ends, down a one-way
``multiprocessing`` pipe of the launch's own context (fork, spawn, forkserver alike; no socket
of ours); a kernel that stops reading never keeps a rank from ending (:data:`SENDER_JOIN_S`),
and a message it cannot read costs that message only. In the kernel one receiver thread per
launch adds them to ``Run.ranks`` (:class:`~traceml_nb.engine.record.RankRecord`, one per
rank).

Where the wrapper cannot be used (under spawn, an ``fn`` that does not pickle), the original
``start_processes`` is called unchanged and the run's capabilities say so.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Protocol

from .capabilities import Capabilities
from .contracts import RunStatus
from .rank_record import RankRecord
from .record import LoaderInfo, RecordSnapshot, RunRecord
from .step_table import StepColumns

if TYPE_CHECKING:
    from .instrument.tracer import StepTracer

#: Seconds between two sends of a rank's new rows: what a rank killed mid-run loses at most.
SEND_INTERVAL_S = 0.25
#: Most rows in one message: keeps each write to the pipe short.
ROWS_PER_MESSAGE = 500
#: Seconds the kernel waits for the receiver to read what the ranks sent once they ended.
RECEIVER_JOIN_S = 5.0
#: Seconds a rank's end waits for its sender to send the rest: a kernel that does not read
#: (gone, or its receiver stopped) leaves the sender blocked on a full pipe, and the rank ends
#: all the same, its channel marked lost (what the kernel had read is kept).
SENDER_JOIN_S = 5.0
#: Seconds between the receiver's checks whether the run has ended.
RECEIVER_POLL_S = 0.1


class MeasuredRun(Protocol):
    """What this module reads and drives of a run (:class:`~traceml_nb.engine.run.Run`, which
    imports this module: named here, not imported)."""

    record: RunRecord
    capabilities: Capabilities
    status: RunStatus
    error: str | None
    watch_ranks: bool

    def start(self) -> None: ...
    def stop(self, exc: BaseException | None = None) -> None: ...
    def snapshot(self, start_row: int = 0, *, samples: bool = True) -> RecordSnapshot: ...
    @property
    def tracer(self) -> StepTracer | None: ...


# --- the child's side --------------------------------------------------------------------------
@dataclass
class RankLaunch:
    """``fn`` as the launcher calls it in each rank (``fn(i, *args)``), with the rank measured.

    ``writers``: the write end of each rank's pipe, by process index; the child keeps its own
    and closes the others. ``engine``: the class of the kernel's run (pickled by reference),
    whose instance measures the rank."""

    fn: Any
    writers: list[Connection]
    engine: Any
    launch: int = 0

    def __call__(self, i: int, *args: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841
        writer = self.writers[i]
        for j, other in enumerate(self.writers):
            if j != i:
                _close(other)
        sender = _start_rank(self.engine, i, writer)
        if sender is None:
            _close(writer)
            return self.fn(i, *args)
        error: BaseException | None = None
        try:
            return self.fn(i, *args)
        except BaseException as exc:
            error = exc
            raise
        finally:
            sender.finish(error)


def _close(conn: Connection) -> None:
    try:
        conn.close()
    except OSError:
        pass


def _start_rank(engine: Any, rank: int, writer: Connection) -> _Sender | None:
    """The rank's run (an ``engine``) started and its sender running; None when it could not
    be (``fn`` then runs unmeasured: measuring never stops the training)."""
    try:
        engine.forget_inherited()
        run = engine(f"rank {rank}", sample=False, device="cpu", session=None)
        run.watch_ranks = False  # a rank's own launches are its business
        run.start()
    except Exception:
        return None
    sender = _Sender(run, writer, rank)
    sender.start()
    return sender


class _Sender:
    """Sends a rank's rows to the kernel from a thread of its own: the new ones while ``fn``
    runs, the rest and the end once :meth:`finish` stopped the rank's run. It is the pipe's
    only writer, so a send the kernel does not read blocks it alone, never the rank."""

    def __init__(self, run: MeasuredRun, writer: Connection, rank: int) -> None:
        self.run = run
        self.writer = writer
        self.rank = rank
        self.sent = 0  #: rows sent so far
        self.broken = False  #: the kernel's end is gone: nothing more is sent
        self._run_stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"traceml-rank-{rank}-sender", daemon=True
        )

    def start(self) -> None:
        rec = self.run.record
        self._send(("start", self.rank, os.getpid(), rec.t0_wall, rec.t0_ns))
        self._thread.start()

    def _send(self, message: tuple[Any, ...]) -> None:
        if self.broken:
            return
        try:
            self.writer.send(message)
        except (OSError, EOFError, ValueError):
            self.broken = True

    def _loop(self) -> None:
        while not self._run_stopped.wait(SEND_INTERVAL_S) and not self.broken:
            try:
                self._send_rows(self.run.snapshot(self.sent, samples=False))
            except Exception:
                self.broken = True
        if not self.broken:  # the run has stopped: the rest and the end
            self._send_end()

    def _send_rows(self, snap: RecordSnapshot) -> None:
        cols = snap.steps
        rows = list(
            zip(
                cols.start_ns,
                cols.wall_ns,
                cols.wait_ns,
                cols.batch,
                cols.source,
                cols.flags,
                strict=True,
            )
        )
        phases = [None] * len(rows) if _uses_cuda() else _host_phases(cols)
        loaders = [info.to_dict() for info in snap.loaders]
        counters = (snap.optimizer_steps, snap.markers, dict(snap.first_fetch_wait_ns))
        for k in range(0, max(len(rows), 1), ROWS_PER_MESSAGE):
            chunk = rows[k : k + ROWS_PER_MESSAGE]
            part = phases[k : k + ROWS_PER_MESSAGE]
            self._send(("rows", self.rank, chunk, loaders, counters, part))
            if not self.broken:
                self.sent += len(chunk)

    def _send_end(self) -> None:
        run = self.run
        try:
            self._send_rows(run.record.snapshot(self.sent, samples=False))
            self._send(
                (
                    "end",
                    self.rank,
                    run.status,
                    run.error,
                    run.record.elapsed_ns,
                    list(run.capabilities.notes),
                    list(run.record.phases_inside),
                )
            )
        except Exception:
            pass

    def finish(self, error: BaseException | None) -> None:
        """Stop the rank's run with ``fn``'s exception (on the rank's own thread, which started
        it), let the sender send the rest and the end, close. Returns within
        :data:`SENDER_JOIN_S` of the run's stop whether or not the kernel reads."""
        try:
            self.run.stop(error)
        except Exception:
            pass
        finally:
            self._run_stopped.set()
        self._thread.join(SENDER_JOIN_S)
        if self._thread.is_alive():  # blocked in a send: the pipe closes with the process
            self.broken = True
        else:
            _close(self.writer)


def _uses_cuda() -> bool:
    """This rank's process has initialised CUDA: its model runs on a GPU (a rank's run watches
    the host only)."""
    import torch

    return bool(torch.cuda.is_initialized())


def _host_phases(cols: StepColumns) -> list[tuple[int, int, int, int] | None]:
    """Each row's host phases (``PHASE_COLUMNS``, ns), None where it has none. A rank on a GPU
    sends none (:func:`_uses_cuda`): its host phases would time the kernels' launch."""
    phases: list[tuple[int, int, int, int] | None] = [None] * len(cols)
    timed = cols.phases
    for row, (c, f, b, o) in zip(timed.index.tolist(), timed.values.tolist(), strict=True):
        phases[row] = (int(c), int(f), int(b), int(o))
    return phases


def _lost(rec: RankRecord) -> None:
    """The rank's channel closed without its end: its time is up to its last row's end."""
    rec.status = "lost"
    if not rec.record.elapsed_ns:
        snap = rec.record.steps.snapshot()
        ends = [s + w for s, w in zip(snap.start_ns, snap.wall_ns, strict=True)]
        rec.record.elapsed_ns = max(ends, default=1) or 1


# --- the kernel's side -------------------------------------------------------------------------
@dataclass
class _Launch:
    """One call of ``start_processes`` seen by the run."""

    number: int
    start_method: str
    readers: list[Connection]
    writers: list[Connection]
    ranks: dict[int, RankRecord] = field(default_factory=dict)
    thread: threading.Thread | None = None


class RankEngine:
    """The kernel's side for one run: the patch's handler, the receivers, the ranks' records
    (``Run.ranks``, in the order they started)."""

    def __init__(self, run: MeasuredRun) -> None:
        self.run = run
        self.ranks: list[RankRecord] = []
        self.launches: list[_Launch] = []
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._installed = False

    def install(self) -> None:
        from .instrument import launch_patch as ranks

        ranks.install(self.handle)
        self._installed = True

    def uninstall(self) -> list[str]:
        """Remove the patch, stop and join the receivers; the notes say what was lost."""
        from .instrument import launch_patch as ranks

        notes = ranks.uninstall() if self._installed else []
        self._installed = False
        self._ended.set()
        for launch in self.launches:
            self._close_writers(launch)
            if launch.thread is not None:
                launch.thread.join(RECEIVER_JOIN_S)
                if launch.thread.is_alive():
                    notes.append(
                        "the ranks' receiver did not stop in time; what it had not read is lost"
                    )
        for rec in self.ranks:
            if rec.status == "running":
                _lost(rec)
        return notes

    # --- the patched start_processes --------------------------------------------------------
    def handle(
        self,
        original: Any,
        fn: Any,
        args: tuple[Any, ...],
        nprocs: int,
        join: bool,
        daemon: bool,
        start_method: str,
    ) -> Any:
        __tracebackhide__ = True  # noqa: F841
        why = self._why_not(fn, nprocs, start_method)
        if why:
            self.run.capabilities.note(f"ranks not measured: {why}; they ran unchanged")
            return original(fn, args, nprocs, join, daemon, start_method)
        import multiprocessing

        if self.run.tracer is not None:  # the children are the ranks: the host counts them all
            self.run.tracer.worker_pids.every_child = True
        ctx = multiprocessing.get_context(start_method)
        pipes = [ctx.Pipe(duplex=False) for _ in range(nprocs)]
        launch = _Launch(
            len(self.launches), start_method, [r for r, _ in pipes], [w for _, w in pipes]
        )
        self.launches.append(launch)
        launch.thread = threading.Thread(
            target=self._receive,
            args=(launch,),
            name=f"traceml-ranks-receiver-{launch.number}",
            daemon=True,
        )
        launch.thread.start()
        wrapped = RankLaunch(fn, launch.writers, type(self.run), launch.number)
        try:
            return original(wrapped, args, nprocs, join, daemon, start_method)
        except BaseException as exc:
            self._close_writers(launch)
            self._note_failure(launch, exc)
            raise
        finally:
            self._close_writers(launch)
            if join and launch.thread is not None:
                launch.thread.join(RECEIVER_JOIN_S)

    @staticmethod
    def _close_writers(launch: _Launch) -> None:
        """The kernel's copies of the write ends: once the children hold theirs (they are
        started), a reader sees the end of its pipe when its rank ends."""
        for conn in launch.writers:
            _close(conn)

    def _why_not(self, fn: Any, nprocs: int, start_method: str) -> str:
        if self._ended.is_set() or self.run.status != "running":
            return "the run had ended"
        if not isinstance(nprocs, int) or nprocs < 1:
            return f"nprocs={nprocs!r}"
        if start_method != "fork":
            from multiprocessing.reduction import ForkingPickler

            try:
                ForkingPickler.dumps(fn)
            except Exception as exc:
                return (
                    f"the function {getattr(fn, '__qualname__', fn)!r} cannot be pickled for "
                    f"the {start_method!r} start method ({type(exc).__name__})"
                )
        return ""

    def _note_failure(self, launch: _Launch, exc: BaseException) -> None:
        """torch's ``ProcessRaisedException`` names the rank that failed: keep its error where
        the rank's own last message did not arrive."""
        index = getattr(exc, "error_index", None)
        if not isinstance(index, int):
            return
        if launch.thread is not None:
            launch.thread.join(RECEIVER_JOIN_S)
        with self._lock:
            rec = launch.ranks.get(index)
            if rec is None:
                rec = self._new_rank(launch, index)
            if rec.status in ("running", "lost", "completed"):
                rec.status = "failed"
            if rec.error is None:
                lines = [line for line in str(getattr(exc, "msg", exc)).splitlines() if line]
                rec.error = lines[-1] if lines else type(exc).__name__

    def _new_rank(self, launch: _Launch, index: int) -> RankRecord:
        rec = RankRecord(index, launch.number)
        launch.ranks[index] = rec
        self.ranks.append(rec)
        return rec

    def _receive(self, launch: _Launch) -> None:
        """Read every rank's pipe until each has closed, or the run has ended and nothing more
        is waiting."""
        open_ = {conn: i for i, conn in enumerate(launch.readers)}
        while open_:
            ready = wait(list(open_), RECEIVER_POLL_S)
            if not ready and self._ended.is_set():
                break
            for conn in ready:
                assert isinstance(conn, Connection)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    self._closed(launch, open_.pop(conn))
                    _close(conn)
                    continue
                except Exception:  # a message cut short by a killed rank
                    continue
                try:
                    self._apply(launch, open_[conn], message)
                except Exception as exc:  # the rank's next messages are still read
                    self.run.capabilities.note(
                        f"a message of rank {open_[conn]} could not be read "
                        f"({type(exc).__name__}: {exc}); it is left out"
                    )
        for conn in list(open_):
            _close(conn)

    def _closed(self, launch: _Launch, index: int) -> None:
        with self._lock:
            rec = launch.ranks.get(index)
            if rec is not None and rec.status == "running":
                _lost(rec)

    def _apply(self, launch: _Launch, index: int, message: Any) -> None:
        kind = message[0]
        with self._lock:
            rec = launch.ranks.get(index) or self._new_rank(launch, index)
            if kind == "start":
                _, _, rec.pid, rec.record.t0_wall, rec.record.t0_ns = message
            elif kind == "rows":
                _, _, rows, loaders, counters, phases = message
                rec.record.steps.extend(rows, phases)
                rec.record.loaders = [LoaderInfo(**info) for info in loaders]
                optimizer_steps, markers, first_fetch = counters
                rec.record.optimizer_steps = optimizer_steps
                rec.record.markers = markers
                rec.record.first_fetch_wait_ns = dict(first_fetch)
            elif kind == "end":
                _, _, rec.status, rec.error, elapsed_ns, notes, inside = message
                rec.record.elapsed_ns = elapsed_ns or max(
                    1, time.perf_counter_ns() - rec.record.t0_ns
                )
                rec.notes = list(notes)
                rec.record.phases_inside = tuple((outer, inner) for outer, inner in inside)


def start(run: MeasuredRun) -> RankEngine:
    """The run's rank engine, its patch installed (the run removes it: :meth:`uninstall`)."""
    engine = RankEngine(run)
    engine.install()
    return engine


#: The environment variables of a rank started by ``torchrun`` (torch.distributed.elastic).
RANK_ENV, WORLD_SIZE_ENV, JOB_ENV = "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"


def launch_identity(
    environ: Mapping[str, str] | None = None,
) -> tuple[int | None, int | None, str | None]:
    """``(rank, world_size, job_id)`` of a process started by ``torchrun`` (from ``RANK``,
    ``WORLD_SIZE``, ``TORCHELASTIC_RUN_ID``), each None where unset or not a number."""
    env = os.environ if environ is None else environ

    def number(name: str) -> int | None:
        text = str(env.get(name, "")).strip()
        return int(text) if text.isdigit() else None

    job = str(env.get(JOB_ENV, "")).strip() or None
    return number(RANK_ENV), number(WORLD_SIZE_ENV), job
