"""``Run``: the measurement engine as a context manager, usable with or without the magic.

::

    with traceml_nb.Run("baseline") as run:
        for x, y in loader:
            ...
    print(run.result())

Entering installs the DataLoader wrapper and the optimizer step hook, and starts the sampler
thread; leaving removes all of them in ``finally`` blocks, whatever ended the run, and never
swallows or replaces the user's exception. A run measures: it fills :attr:`Run.record` and
:attr:`Run.capabilities`. What the numbers mean, the history and the report belong to the
session the run reports to (:mod:`traceml_nb.session`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from .capabilities import Capabilities
from .contracts import RunStatus
from .options import Backends, RunOptions
from .rank_record import RankRecord
from .record import RecordSnapshot, RunRecord

if TYPE_CHECKING:
    from .instrument.flop_count import FlopWindow
    from .instrument.gpu_events import GpuStallTimer
    from .instrument.profiler import ProfileWindow
    from .instrument.tracer import StepTracer
    from .rank_launch import RankEngine
    from .sampling import Collector

MIN_INTERVAL_S = 0.02  #: 50 Hz
MAX_INTERVAL_S = 1.0  #: 1 Hz

#: Why the GPU figures of a run on the CPU are missing.
NO_CUDA = "no CUDA device in this run, CPU only"

_active_lock = threading.Lock()
_active: Run | None = None


class RunAlreadyActiveError(RuntimeError):
    """Raised when a run starts while another one is still measuring."""


class Concluder(Protocol):
    """What :meth:`Run.result` hands an ended run to: a session (``traceml_nb.Session``)."""

    def result(self, run: Run) -> Any: ...


def active_run() -> Run | None:
    """The run currently measuring, if any."""
    return _active


def step() -> None:
    """Mark the end of a training step of a custom loop (no-op when no run is active)."""
    run = _active
    if run is not None:
        run.step()


def resolve_device(device: str | int | None) -> tuple[str, int | None]:
    """``(kind, cuda_index)`` for a ``--device`` value: None/'auto' picks CUDA when available.

    An index the machine does not have is refused here, before anything runs (a CPU-only
    machine has no ``cuda:N`` at all)."""
    import torch

    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    if device is None or device == "auto":
        return ("cuda", torch.cuda.current_device()) if available else ("cpu", None)
    if isinstance(device, int) and not isinstance(device, bool):
        index: int | None = device
    else:
        text = str(device).strip().lower()
        if text == "cpu":
            return "cpu", None
        if text == "cuda":
            index = torch.cuda.current_device() if available else 0
        elif text.startswith("cuda:") and text[5:].isdigit():
            index = int(text[5:])
        elif text.isdigit():
            index = int(text)
        else:
            raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    assert index is not None
    if not available:
        if index > 0:
            raise ValueError(f"device cuda:{index} does not exist: this machine has no CUDA device")
        return "cuda", index  # a run on 'cuda' without CUDA: measured, its GPU figures explained
    if index >= count:
        raise ValueError(
            f"device cuda:{index} does not exist: this machine has {count} CUDA device(s), "
            f"cuda:0 to cuda:{count - 1}"
        )
    return "cuda", index


def validate_interval(interval: float | str) -> float:
    """The sampler interval in seconds, checked against the supported 1–50 Hz."""
    try:
        value = float(interval)
    except (TypeError, ValueError):
        raise ValueError(f"interval must be a number of seconds, got {interval!r}") from None
    if not (MIN_INTERVAL_S <= value <= MAX_INTERVAL_S):
        raise ValueError(
            f"interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} s (50 Hz to 1 Hz), got {interval!r}"
        )
    return value


class Run:
    """Measures the code inside its ``with`` block.

    Parameters
    ----------
    name: label of the run in reports and history (``named`` tells whether one was given).
    options: how it is measured and concluded (:class:`RunOptions`); its fields may also be
        given as keywords (``Run("x", interval=0.05, log_to="wandb")``), over ``options``.
    source, cell_id: the code measured and the frontend's id of its cell, for the history.
    code_file: the file whose lines a profile names (a notebook cell's name in the line cache;
        default: the file that starts the run).
    session: where :meth:`result` reports (default: see :meth:`default_session`).
    backends: the hardware's stand-ins (:class:`Backends`; tests); None: the real ones.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        options: RunOptions | None = None,
        source: str | None = None,
        cell_id: str | None = None,
        code_file: str | None = None,
        session: Concluder | None = None,
        backends: Backends | None = None,
        **settings: Any,
    ) -> None:
        try:
            options = replace(options or RunOptions(), **settings)
        except TypeError:
            known = ", ".join(RunOptions.__dataclass_fields__)
            unknown = ", ".join(sorted(set(settings) - set(RunOptions.__dataclass_fields__)))
            raise TypeError(f"Run() got unknown options: {unknown} (options are {known})") from None
        if options.profile is not None and options.profile < 1:
            raise ValueError(
                f"profile must be a number of steps of at least 1, got {options.profile}"
            )
        #: how it measures and is concluded (the one source: read, never copied)
        self.options = replace(options, interval=validate_interval(options.interval))
        self.name = name or "run"
        self.named = name is not None
        self.device_kind, self.cuda_index = resolve_device(options.device)
        self.source, self.cell_id = source, cell_id
        self.definitions: dict[str, str] | None = None  #: notebook code a cell uses (the magic's)
        self.values: dict[str, str] | None = None  #: notebook values a cell reads (the magic's)
        self.session, self.code_file = session, code_file
        self.record = RunRecord()
        self.capabilities = Capabilities()
        self.status: RunStatus = "created"
        self.error: str | None = None
        self.started_at: float | None = None
        self._backends = backends if backends is not None else Backends()
        self._tracer: StepTracer | None = None
        self._window: ProfileWindow | None = None
        self._flops: FlopWindow | None = None  #: counts one step's FLOPs
        self._collector: Collector | None = None
        self._result: Any = None
        #: the ranks this run launched (:mod:`.rank_launch`), one record each, in start order
        self.ranks: list[RankRecord] = []
        self.watch_ranks = True  #: route ``torch.multiprocessing.start_processes`` through it
        self._ranks_launched: RankEngine | None = None
        from .rank_launch import launch_identity

        #: ``RANK``, ``WORLD_SIZE``, ``TORCHELASTIC_RUN_ID`` of a process ``torchrun`` started
        self.rank, self.world_size, self.job_id = launch_identity()

    # --- lifecycle ----------------------------------------------------------------------------
    @staticmethod
    def forget_inherited() -> None:
        """In a forked rank: drop the copy of the kernel's active run and its patches, in this
        process only (:mod:`.rank_launch` calls it before the rank's own run starts)."""
        global _active
        from .instrument import hooks
        from .instrument import launch_patch as ranks

        ranks.forget()
        hooks.uninstall()
        _active = None

    def __enter__(self) -> Run:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop(exc)  # the user's exception, if any, goes on unchanged

    def start(self) -> None:
        global _active
        with _active_lock:
            if _active is not None:
                raise RunAlreadyActiveError(
                    f"traceml_nb run {_active.name!r} is still measuring; runs cannot be nested "
                    "or overlap (end the other run first)"
                )
            _active = self
        try:
            self._start()
        except BaseException:
            self._teardown()
            raise

    def _start(self) -> None:
        from .instrument import hooks
        from .instrument.flop_count import FlopWindow
        from .instrument.tracer import StepTracer

        rec = self.record
        rec.t0_wall = time.time()
        rec.t0_ns = time.perf_counter_ns()
        self.started_at = rec.t0_wall
        self.status = "running"
        self._tracer = StepTracer(rec, gpu=self._make_gpu_timer())
        self.capabilities.set("steps", True)
        self.capabilities.set("data_wait", True)
        if self.options.profile is not None:
            self._window = self._make_window()
        tracer = self._tracer
        self._flops = FlopWindow(
            tracer.clock, rec.t0_ns, partial(setattr, rec, "flops"), tracer.evaluated_since
        )
        hooks.install(self._tracer, self._window, self._flops)
        if self.watch_ranks:
            from . import rank_launch

            self._ranks_launched = rank_launch.start(self)
            self.ranks = self._ranks_launched.ranks
        if self.options.sample:
            self._start_sampling()
        else:
            for name in ("nvml", "gpu_utilisation", "host"):
                self.capabilities.set(name, False, "sampling switched off for this run")

    def _make_gpu_timer(self) -> GpuStallTimer | None:
        from .instrument.gpu_events import GpuStallTimer, cuda_event_factory, cuda_stream_getter

        if self._backends.event_factory is not None:
            self.capabilities.set("gpu_events", True)
            return GpuStallTimer(
                self.record.steps, self._backends.event_factory, self._backends.stream_getter
            )
        import torch

        if self.device_kind != "cuda":
            why = NO_CUDA if not torch.cuda.is_available() else "the run watches the CPU"
            self.capabilities.set("gpu_events", False, why)
            self.capabilities.set("gpu_memory", False, why)
            return None
        if not torch.cuda.is_available():
            self.capabilities.set("gpu_events", False, "CUDA is not available to PyTorch")
            return None
        self.capabilities.set("gpu_events", True)
        assert self.cuda_index is not None
        return GpuStallTimer(
            self.record.steps,
            cuda_event_factory(self.cuda_index),
            cuda_stream_getter(self.cuda_index),
        )

    def _make_window(self) -> ProfileWindow:
        from .instrument.profiler import DEFAULT_PROFILE_AFTER_STEPS, ProfileWindow

        code_file = self.code_file
        if code_file is None:  # the caller of ``with Run()`` / ``run.start()``
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename == __file__:
                frame = frame.f_back  # type: ignore[assignment]
            code_file = frame.f_code.co_filename if frame is not None else None
        opts = self.options
        assert opts.profile is not None
        return ProfileWindow(
            opts.profile,
            DEFAULT_PROFILE_AFTER_STEPS if opts.profile_after is None else opts.profile_after,
            cuda=self.device_kind == "cuda" and self.capabilities.ok("gpu_events"),
            t0_ns=self.record.t0_ns,
            cell_file=code_file,
            trace_dir=opts.profile_dir,
            name=self.name,
        )

    def _start_sampling(self) -> None:
        from .sampling import Collector, open_sources

        devices = (
            [self.cuda_index] if self.device_kind == "cuda" and self.cuda_index is not None else []
        )
        if not devices:
            self.capabilities.set("nvml", False, NO_CUDA)
            self.capabilities.set("gpu_utilisation", False, NO_CUDA)
        try:
            sources = open_sources(
                self.record,
                self.capabilities,
                devices,
                nvml=self._backends.nvml,
                gpu=bool(devices),
                worker_pids=self._tracer.worker_pids if self._tracer is not None else None,
            )
        except Exception as exc:  # never let a sampler stop the run
            self.capabilities.note(f"samplers failed to start: {type(exc).__name__}: {exc}")
            return
        self._collector = Collector(
            sources, self.options.interval, self.capabilities, self.record.t0_ns / 1e9
        )
        self._collector.start()

    def step(self) -> None:
        """Explicit end-of-step marker for custom loops."""
        if self._tracer is not None:
            self._tracer.marker()
            if self._window is not None:
                from .instrument import hooks

                hooks.marker(self._window)

    def stop(self, exc: BaseException | None = None) -> None:
        """End the run; ``exc`` is the exception that ended it, if any."""
        if self.status != "running" and _active is not self:
            return
        if exc is None:
            self.status = "completed"
        elif isinstance(exc, KeyboardInterrupt):
            self.status = "interrupted"
            self.error = "KeyboardInterrupt"
        else:
            self.status = "failed"
            self.error = f"{type(exc).__name__}: {exc}"
        self._teardown()

    def _teardown(self) -> None:
        """Remove everything this run installed; each part is attempted whatever the others do."""
        global _active
        from .instrument import hooks

        try:
            if self._ranks_launched is not None:  # the patch removed, the receivers joined
                for note in self._ranks_launched.uninstall():
                    self.capabilities.note(note)
        except Exception as exc:
            self.capabilities.note(f"the ranks' receiver could not be stopped: {exc}")
        try:
            if self._window is not None:  # no profiler left running, whatever follows
                self._window.end(self._ended_by())
        except Exception as exc:
            self.capabilities.note(f"the profiler could not be stopped: {exc}")
        try:
            if self._flops is not None:  # no FLOP counter left counting
                self.record.flops = self._flops.close()
        except Exception as exc:
            self.capabilities.note(f"the FLOP counter could not be stopped: {exc}")
        try:
            self.record.phases_inside = hooks.phases_inside()
            for note in hooks.uninstall():
                self.capabilities.note(note)
        finally:
            try:
                if self._collector is not None:
                    self._collector.stop()
            finally:
                try:
                    if self._tracer is not None:
                        self._tracer.close(self.status == "completed")
                        self._note_tracer_error()
                except Exception as exc:
                    self.capabilities.note(
                        f"the last steps could not be closed: {type(exc).__name__}: {exc}"
                    )
                finally:
                    self.record.elapsed_ns = time.perf_counter_ns() - self.record.t0_ns
                    with _active_lock:
                        if _active is self:
                            _active = None
                    self._finish_profile()

    def _ended_by(self) -> str:
        return {"failed": "the run failed", "interrupted": "the run was interrupted"}.get(
            self.status, "the run ended"
        )

    def _finish_profile(self) -> None:
        """Write the profile's trace and read its events, after the run's own time is taken."""
        window, self._window = self._window, None
        if window is None:
            return
        from .profile_capture import ProfileCapture

        try:
            capture = window.finish(self._ended_by())
        except Exception as exc:
            capture = ProfileCapture(window.steps, window.after_steps)
            capture.why = f"the profile could not be read: {type(exc).__name__}: {exc}"
        self.record.profile = capture
        self.capabilities.set("profile", capture.captured, capture.why)

    def _note_tracer_error(self) -> None:
        error = self._tracer.error if self._tracer is not None else None
        if error is not None:
            self.capabilities.note(
                f"step tracing stopped during the run (our bug, not yours: {error}); the steps "
                "before it are kept, the training went on untraced"
            )

    # --- reading --------------------------------------------------------------------------
    def snapshot(self, start_row: int = 0, *, samples: bool = True) -> RecordSnapshot:
        """The record as it is now, step rows from ``start_row`` on (sample tables unless
        ``samples`` is False): the engine first turns what the run has logged into rows (they
        otherwise lag the loop by a few hundred steps), and the rows, loaders and counters of
        the copy agree. Any thread may call it."""
        tracer = self._tracer
        if tracer is None:
            return self.record.snapshot(start_row, samples=samples)
        return tracer.read(lambda: self.record.snapshot(start_row, samples=samples))

    def catch_up(self) -> None:
        """Turn what the run has logged so far into step rows now, on the calling thread: a
        reader keeping up between its reads (so that the training loop never has to), or about
        to copy the whole record (:meth:`snapshot`) and counting the copy's time apart from the
        engine's work."""
        if self._tracer is not None:
            self._tracer.process()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """For a thread that calls :meth:`snapshot` regularly while the run goes on (a live
        view): inside the block the training loop only logs its steps and leaves turning them
        into rows to the reader; when the block ends the loop takes that work back."""
        tracer = self._tracer
        if tracer is None:
            yield
            return
        tracer.attach_reader(True)
        try:
            yield
        finally:
            tracer.attach_reader(False)

    def result(self) -> Any:
        """The analysed result (:class:`traceml_nb.session.RunResult`) of an ended run.

        The first call hands the run to its session, which analyses it, compares it with the
        earlier runs of the same name and keeps it in the history; later calls return the same.
        """
        if self._result is None:
            session = self.session if self.session is not None else self.default_session()
            self._result = session.result(self)
        return self._result

    def default_session(self) -> Concluder:
        """Where a run given no session reports: nowhere here (this layer knows no session);
        ``traceml_nb.Run``, the public class, reports to the kernel's session."""
        raise RuntimeError(
            "this run has no session to report to: give it one (session=...), or use "
            "traceml_nb.Run, which reports to the kernel's session"
        )

    @property
    def elapsed_s(self) -> float:
        """Seconds since the start (live) or the run's duration (ended)."""
        if self.record.elapsed_ns:
            return self.record.elapsed_ns / 1e9
        if not self.record.t0_ns:
            return 0.0
        return (time.perf_counter_ns() - self.record.t0_ns) / 1e9

    @property
    def sampler_busy_s(self) -> float:
        """CPU seconds the sampler thread spent sampling."""
        return self._collector.busy_s if self._collector is not None else 0.0

    @property
    def tracer(self) -> StepTracer | None:
        """The run's :class:`~traceml_nb.engine.instrument.tracer.StepTracer` (None before the start):
        its ``processing_ns`` and ``reader_processing_ns`` say what segmenting the steps cost."""
        return self._tracer

    def __repr__(self) -> str:
        return f"<traceml_nb.Run {self.name!r} {self.status}, {len(self.record.steps)} step rows, {self.elapsed_s:.1f} s>"
