"""``Run``: the measurement engine as a context manager, usable with or without the magic.

::

    with traceml_nb.Run("baseline") as run:
        for x, y in loader:
            ...
    print(run.result())

Entering installs the DataLoader wrapper and the optimizer step counting, and starts the sampler
thread; leaving removes all of them in ``finally`` blocks, whatever ended the run, and never
swallows or replaces the user's exception.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .capabilities import Capabilities
from .record import RunRecord

STATUS_RUNNING = "running"
STATUS_COMPLETED = "completed"
STATUS_FAILED = "failed"
STATUS_INTERRUPTED = "interrupted"

MIN_INTERVAL_S = 0.02  #: 50 Hz
MAX_INTERVAL_S = 1.0  #: 1 Hz

_active_lock = threading.Lock()
_active: Run | None = None


class RunAlreadyActiveError(RuntimeError):
    """Raised when a run starts while another one is still measuring."""


def active_run() -> Run | None:
    """The run currently measuring, if any."""
    return _active


def step() -> None:
    """Mark the end of a training step of a custom loop (no-op when no run is active)."""
    run = _active
    if run is not None and run._tracer is not None:
        run._tracer.marker()


def resolve_device(device: str | int | None) -> tuple[str, int | None]:
    """``(kind, cuda_index)`` for a ``--device`` value: None/'auto' picks CUDA when available."""
    import torch

    if device is None or device == "auto":
        if torch.cuda.is_available():
            return "cuda", torch.cuda.current_device()
        return "cpu", None
    if isinstance(device, int):
        return "cuda", device
    text = str(device).strip().lower()
    if text == "cpu":
        return "cpu", None
    if text == "cuda":
        return "cuda", 0 if not torch.cuda.is_available() else torch.cuda.current_device()
    index = int(text[5:]) if text.startswith("cuda:") and text[5:].isdigit() else None
    if index is None and text.isdigit():
        index = int(text)
    if index is not None:
        if torch.cuda.is_available() and index >= torch.cuda.device_count():
            raise ValueError(
                f"device cuda:{index} does not exist: {torch.cuda.device_count()} CUDA device(s) visible"
            )
        return "cuda", index
    raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")


def validate_interval(interval: float) -> float:
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
    name: label of the run in reports and history.
    interval: sampler period in seconds (0.02–1.0; default 0.1 = 10 Hz).
    device: ``None``/``'auto'``, ``'cpu'``, ``'cuda'``, ``'cuda:N'``.
    sample: run the background samplers (GPU via NVML, host via psutil).
    nvml: an injected NVML backend (tests); ``None`` uses ``pynvml``.
    event_factory, stream_getter: injected CUDA-event class and stream (tests); on a CUDA
        device the real ``torch.cuda.Event`` is used automatically.
    on_start, on_end: callbacks (the views) called with the run after it starts / ends.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        interval: float = 0.1,
        device: str | int | None = None,
        sample: bool = True,
        nvml: Any = None,
        event_factory: Callable[[], Any] | None = None,
        stream_getter: Callable[[], Any] | None = None,
        source: str | None = None,
        cell_id: str | None = None,
        on_start: Callable[[Run], None] | None = None,
        on_end: Callable[[Run], None] | None = None,
    ) -> None:
        self.name = name or "run"
        self._named = name is not None
        self.interval = validate_interval(interval)
        self.device_kind, self.cuda_index = resolve_device(device)
        self.sample = sample
        self.source = source
        self.cell_id = cell_id
        self.record = RunRecord()
        self.capabilities = Capabilities()
        self.status = "created"
        self.error: str | None = None
        self.started_at: float | None = None
        self._nvml = nvml
        self._event_factory = event_factory
        self._stream_getter = stream_getter
        self._on_start = on_start
        self._on_end = on_end
        self._tracer: Any = None
        self._collector: Any = None
        self._result: Any = None

    # --- lifecycle ----------------------------------------------------------------------------
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
        from .instrument import patches
        from .instrument.tracer import StepTracer

        rec = self.record
        rec.t0_wall = time.time()
        rec.t0_ns = time.perf_counter_ns()
        self.started_at = rec.t0_wall
        self.status = STATUS_RUNNING
        gpu = self._make_gpu_timer()
        self._tracer = StepTracer(rec, gpu=gpu)
        self.capabilities.set("steps", True)
        self.capabilities.set("data_wait", True)
        for note in patches.install(self._tracer):
            self.capabilities.note(note)
        if self.sample:
            self._start_sampling()
        else:
            for name in ("nvml", "gpu_utilisation", "host"):
                self.capabilities.set(name, False, "sampling switched off for this run")
        if self._on_start is not None:
            try:
                self._on_start(self)
            except Exception as exc:
                self.capabilities.note(f"live view failed to start: {type(exc).__name__}: {exc}")

    def _make_gpu_timer(self) -> Any:
        from .instrument.gpu_events import GpuStallTimer, cuda_event_factory, cuda_stream_getter

        if self._event_factory is not None:
            self.capabilities.set("gpu_events", True)
            return GpuStallTimer(self.record.steps, self._event_factory, self._stream_getter)
        if self.device_kind != "cuda":
            import torch

            why = (
                "no CUDA device in this run (CPU-only)"
                if not torch.cuda.is_available()
                else "run set to device cpu"
            )
            self.capabilities.set("gpu_events", False, why)
            self.capabilities.set("gpu_memory", False, why)
            return None
        import torch

        if not torch.cuda.is_available():
            self.capabilities.set("gpu_events", False, "CUDA is not available to PyTorch")
            return None
        self.capabilities.set("gpu_events", True)
        assert self.cuda_index is not None
        return GpuStallTimer(
            self.record.steps, cuda_event_factory(), cuda_stream_getter(self.cuda_index)
        )

    def _start_sampling(self) -> None:
        from .sampling import Collector, open_sources

        devices = (
            [self.cuda_index] if self.device_kind == "cuda" and self.cuda_index is not None else []
        )
        if not devices:
            self.capabilities.set("nvml", False, "no CUDA device in this run (CPU-only)")
            self.capabilities.set("gpu_utilisation", False, "no CUDA device in this run (CPU-only)")
        try:
            sources = open_sources(
                self.record, self.capabilities, devices, nvml=self._nvml, gpu=bool(devices)
            )
        except Exception as exc:  # never let a sampler stop the run
            self.capabilities.note(f"samplers failed to start: {type(exc).__name__}: {exc}")
            return
        self._collector = Collector(
            sources, self.interval, self.capabilities, self.record.t0_ns / 1e9
        )
        self._collector.start()

    def process_steps(self) -> None:
        """Bring the step rows of :attr:`record` up to date with what the run has logged (they
        otherwise lag the loop by up to a few hundred steps). Thread-safe: a reader of a
        running run calls it before reading; see :meth:`step_reader`."""
        if self._tracer is not None:
            self._tracer.process()

    @contextmanager
    def step_reader(self) -> Iterator[None]:
        """For the thread that reads the record while the run goes on (a live view): inside
        the block it calls :meth:`process_steps` before each of its reads, so the training
        loop only logs its steps; when the block ends the loop takes that work back."""
        tracer = self._tracer
        if tracer is None:
            yield
            return
        tracer.attach_reader(True)
        try:
            yield
        finally:
            tracer.attach_reader(False)

    def step(self) -> None:
        """Explicit end-of-step marker for custom loops."""
        if self._tracer is not None:
            self._tracer.marker()

    def stop(self, exc: BaseException | None = None) -> None:
        """End the run; ``exc`` is the exception that ended it, if any."""
        if self.status not in (STATUS_RUNNING,) and _active is not self:
            return
        if exc is None:
            self.status = STATUS_COMPLETED
        elif isinstance(exc, KeyboardInterrupt):
            self.status = STATUS_INTERRUPTED
            self.error = "KeyboardInterrupt"
        else:
            self.status = STATUS_FAILED
            self.error = f"{type(exc).__name__}: {exc}"
        self._teardown()
        if self._on_end is not None:
            try:
                self._on_end(self)
            except Exception as exc2:
                self.capabilities.note(f"report failed: {type(exc2).__name__}: {exc2}")

    def _teardown(self) -> None:
        """Remove everything this run installed; each part is attempted whatever the others do."""
        global _active
        from .instrument import patches

        try:
            for note in patches.uninstall():
                self.capabilities.note(note)
        finally:
            try:
                if self._collector is not None:
                    self._collector.stop()
            finally:
                try:
                    if self._tracer is not None:
                        self._tracer.close()
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

    def _note_tracer_error(self) -> None:
        error = self._tracer.error
        if error is not None:
            self.capabilities.note(
                f"step tracing stopped during the run (our bug, not yours: {error}); the steps "
                "before it are kept, the training went on untraced"
            )

    # --- reading --------------------------------------------------------------------------
    def result(self) -> Any:
        """The analysed result (:class:`traceml_nb.result.RunResult`) of an ended run.

        The first call analyses the run, compares it with the earlier runs of the same name
        and adds it to the session history (``%traceml history``); later calls return the same.
        """
        if self._result is None:
            from .result import conclude_run

            self._result = conclude_run(self, named=self._named, source=self.source)
        return self._result

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

    def __repr__(self) -> str:
        return f"<traceml_nb.Run {self.name!r} {self.status}, {len(self.record.steps)} step rows, {self.elapsed_s:.1f} s>"
