"""The channel between a rank and the kernel (:mod:`traceml_nb.engine.rank_launch`) never
holds either up: a rank ends when its training ends though the kernel reads nothing, and a
message the kernel cannot read costs that message only. A real pipe, a real run in this
process standing for the rank's (as :class:`RankLaunch` starts it in a child)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.engine import rank_launch
from traceml_nb.engine.capabilities import Capabilities
from traceml_nb.engine.instrument import hooks

#: Steps of the rank's loop: their rows pickle to several times a pipe's 64 KiB buffer.
STEPS = 6000


def _drain(reader, wait_s: float | None = 0.2) -> list[tuple]:
    """The messages until none comes within ``wait_s`` (None: until the pipe's end)."""
    messages = []
    while reader.poll(wait_s):
        try:
            messages.append(reader.recv())
        except EOFError:
            break
    return messages


def test_a_rank_ends_when_the_kernel_reads_nothing_and_its_run_is_stopped(monkeypatch):
    monkeypatch.setattr(rank_launch, "SENDER_JOIN_S", 0.5)
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = rank_launch._start_rank(traceml_nb.Run, 0, writer)
    assert sender is not None
    ended = threading.Event()
    try:
        for _ in DataLoader(TensorDataset(torch.zeros(STEPS, 1)), batch_size=1):
            pass
        time.sleep(3 * rank_launch.SEND_INTERVAL_S)  # the sender fills the pipe, and waits

        def end() -> None:
            sender.finish(None)
            ended.set()

        threading.Thread(target=end, daemon=True).start()
        assert ended.wait(10), "the rank's end waited for a kernel that reads nothing"
        assert sender.run.status == "completed"
        assert not hooks.is_installed()
        assert sender.broken  # nothing more is sent: the kernel will see the rank lost
    finally:
        messages = _drain(reader)  # lets a blocked sender go (and, before, a blocked end)
        ended.wait(10)
        writer.close()
        reader.close()
    assert messages[0][0] == "start"
    assert sum(len(m[2]) for m in messages if m[0] == "rows") < STEPS
    assert "end" not in [m[0] for m in messages]


def test_a_kernel_that_reads_gets_every_row_and_the_end():
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = rank_launch._start_rank(traceml_nb.Run, 0, writer)
    assert sender is not None
    received: list[tuple] = []
    reading = threading.Thread(target=lambda: received.extend(_drain(reader, None)))
    reading.start()
    for _ in DataLoader(TensorDataset(torch.zeros(STEPS, 1)), batch_size=1):
        pass
    sender.finish(None)
    reading.join(10)
    reader.close()
    assert [m[0] for m in received][0] == "start" and received[-1][0] == "end"
    assert received[-1][2] == "completed" and received[-1][6] == []  # no phase inside another
    assert sum(len(m[2]) for m in received if m[0] == "rows") == STEPS


class _Kernel:
    """What the receiver reads of the kernel's run."""

    def __init__(self) -> None:
        self.capabilities = Capabilities()


def test_a_message_the_kernel_cannot_read_is_left_out_and_the_next_ones_are_read():
    run = _Kernel()
    engine = rank_launch.RankEngine(run)  # type: ignore[arg-type]
    reader, writer = multiprocessing.Pipe(duplex=False)
    launch = rank_launch._Launch(0, "fork", [reader], [writer])
    writer.send(("start", 0, 123, time.time(), time.perf_counter_ns()))
    writer.send(("rows", 0, [], [{"no such field": 1}], (0, 0, {}), []))
    writer.send(("end", 0, "completed", None, 10**6, [], [["optimizer", "forward"]]))
    writer.close()
    engine._receive(launch)  # returns once the rank's channel is closed
    (rec,) = engine.ranks
    assert rec.status == "completed" and rec.record.elapsed_ns == 10**6
    assert rec.record.phases_inside == (("optimizer", "forward"),)  # as the rank's analysis reads
    (note,) = run.capabilities.notes
    assert note.startswith("a message of rank 0 could not be read (TypeError: ")
