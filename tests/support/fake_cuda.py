"""A simulated GPU timeline with events that follow ``torch.cuda.Event``'s contract, and a
stand-in for the part of ``torch.cuda`` that describes the devices.

Only the hardware boundary is faked: ``record(stream)``, ``query()``, ``elapsed_time(other)``
and ``synchronize()``. Time is a fake host clock in nanoseconds that the test advances; the
stream runs queued kernels one after another, so an event completes when the work queued
before it is done (or when it was recorded, if the GPU was idle).

:class:`FakeCuda` answers ``is_available()``, ``device_count()`` and
``get_device_properties(i)`` with :class:`FakeDeviceProperties` (the attributes of PyTorch's
``_CudaDeviceProperties`` that are read), or raises PyTorch's errors for them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class FakeDeviceProperties:
    """What ``torch.cuda.get_device_properties`` gives for one device (the fields read)."""

    name: str
    total_memory: int  #: bytes
    major: int
    minor: int
    uuid: str | None = None  #: PyTorch prints it without the ``GPU-`` prefix
    pci_bus_id: int | None = None
    pci_domain_id: int = 0
    pci_device_id: int = 0


#: As PyTorch describes these GPUs (names as the driver gives them, memory in bytes).
TESLA_T4 = FakeDeviceProperties("Tesla T4", 15_655_829_504, 7, 5)
A100_40GB = FakeDeviceProperties("NVIDIA A100-SXM4-40GB", 42_298_834_944, 8, 0)


class FakeCuda:
    """Stands in for ``torch.cuda``: ``devices`` are its CUDA devices, in CUDA's order.

    ``available=False``: ``is_available()`` says no. ``properties_error``: an exception
    ``get_device_properties`` raises (a CUDA error at the end of a run); an index past the
    devices raises PyTorch's ``AssertionError("Invalid device id")``. ``count_error``: raised
    by ``device_count``.
    """

    def __init__(
        self,
        devices: list[FakeDeviceProperties],
        *,
        available: bool = True,
        properties_error: BaseException | None = None,
        count_error: BaseException | None = None,
    ) -> None:
        self.devices = list(devices)
        self.available = available
        self.properties_error = properties_error
        self.count_error = count_error
        self.property_calls = 0

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        if self.count_error is not None:
            raise self.count_error
        return len(self.devices)

    def get_device_properties(self, index: int) -> FakeDeviceProperties:
        self.property_calls += 1
        if self.properties_error is not None:
            raise self.properties_error
        if not 0 <= index < len(self.devices):
            raise AssertionError("Invalid device id")
        return self.devices[index]


def with_uuid(props: FakeDeviceProperties, nvml_uuid: str) -> FakeDeviceProperties:
    """``props`` with the UUID PyTorch would print for the NVML device ``nvml_uuid``."""
    return replace(props, uuid=nvml_uuid.removeprefix("GPU-"))


class FakeTimeline:
    """The host clock, one GPU queue, and counters of what the events were asked.

    ``stream`` is the current stream :meth:`current_stream` returns (``stream_lookups``
    counts its calls); each event notes the stream it was recorded on. ``created`` counts the
    events made, ``unread_rerecords`` the records of an event whose previous recording
    completed a step nobody read (its elapsed time never asked).
    """

    def __init__(self) -> None:
        self.now_ns = 0  #: host clock
        self.busy_until_ns = 0  #: when the GPU finishes the work queued so far
        self.records = 0
        self.queries = 0
        self.syncs = 0
        self.created = 0
        self.unread_rerecords = 0
        self.stream: object = "stream 0"
        self.stream_lookups = 0

    def clock(self) -> int:
        return self.now_ns

    def host(self, ms: float) -> None:
        """The host spends ``ms`` (Python, waiting for data...)."""
        self.now_ns += int(ms * 1e6)

    def launch(self, ms: float) -> None:
        """Queue a kernel of ``ms`` GPU time (asynchronous: costs the host nothing)."""
        self.busy_until_ns = max(self.busy_until_ns, self.now_ns) + int(ms * 1e6)

    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def current_stream(self) -> object:
        """What ``torch.cuda.current_stream(device)`` answers: :attr:`stream`."""
        self.stream_lookups += 1
        return self.stream


class FakeEvent:
    def __init__(self, timeline: FakeTimeline) -> None:
        self._tl = timeline
        self.done_at_ns: int | None = None
        self.stream: object = None  #: the stream of the last record
        self.read = False  #: an elapsed time involving the last recording was asked
        self.recordings = 0

    def record(self, stream: object = None) -> None:
        tl = self._tl
        tl.records += 1
        if self.recordings and not self.read:
            tl.unread_rerecords += 1
        self.recordings += 1
        self.read = False
        self.stream = stream
        self.done_at_ns = max(tl.now_ns, tl.busy_until_ns)

    def _done(self) -> bool:
        assert self.done_at_ns is not None, "query() before record()"
        return self._tl.now_ns >= self.done_at_ns

    def query(self) -> bool:
        self._tl.queries += 1
        return self._done()

    def elapsed_time(self, end_event: FakeEvent) -> float:
        if self.done_at_ns is None or end_event.done_at_ns is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self._done() and end_event._done()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        self.read = end_event.read = True
        return (end_event.done_at_ns - self.done_at_ns) / 1e6

    def synchronize(self) -> None:
        tl = self._tl
        tl.syncs += 1
        assert self.done_at_ns is not None
        tl.now_ns = max(tl.now_ns, self.done_at_ns)
