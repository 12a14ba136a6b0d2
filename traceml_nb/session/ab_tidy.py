"""What the A/B gate starts and must remove, however it ends: its runs' process groups, a
temporary git worktree of the base, a temporary directory; and the signals around that cleanup
(SIGTERM raises :class:`Terminated` while the gate runs, a second Ctrl-C or SIGTERM does not cut
the cleanup short).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

#: Seconds a run's process group gets between SIGTERM and SIGKILL when the gate stops it.
KILL_GRACE_S = 2.0


class Terminated(BaseException):
    """SIGTERM arrived while the gate ran; raised after its cleanup, like KeyboardInterrupt."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


# --- git ------------------------------------------------------------------------------------------
def git(args: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except OSError as exc:  # no git at all
        return subprocess.CompletedProcess(["git", *args], 127, "", str(exc))


def git_out(args: list[str], cwd: str) -> str | None:
    """git's stripped output, or None when it failed."""
    done = git(args, cwd)
    return done.stdout.strip() if done.returncode == 0 else None


def git_toplevel(cwd: str) -> str | None:
    top = git_out(["rev-parse", "--show-toplevel"], cwd)
    return os.path.abspath(top) if top else None


def one_line(text: str) -> str:
    return " ".join(text.split()) or "no message"


# --- cleanup, however it ends ----------------------------------------------------------------------
@dataclass
class Tidy:
    """What the gate made and must remove: its runs' processes, the worktree, the temp dir."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tmpdir: str | None = None
    repo: str | None = None
    worktree: str | None = None

    def close(self) -> None:
        for proc in list(self.procs):
            stop(proc)
            self.procs.remove(proc)
        if self.worktree is not None and self.repo is not None:
            git(["worktree", "remove", "--force", "--force", self.worktree], self.repo)
            self.worktree = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        if self.repo is not None:
            git(["worktree", "prune"], self.repo)
            self.repo = None


def _killpg(pgid: int, sig: int) -> bool:
    """Signal the process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the run's whole process group (the command and whatever it started): SIGTERM, then
    SIGKILL after ``KILL_GRACE_S``; the command itself is reaped."""
    if proc.poll() is None and _killpg(proc.pid, signal.SIGTERM):
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)
    # Its pid stays reserved while any process of its group lives, so this reaches only them.
    _killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait()


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` (so the cleanup runs) while the gate runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM does not cut the cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
