"""A JupyterLab server process started by a test: wait until it answers, ask it, stop it."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def status(url: str, token: str, path: str = "api/status") -> int | None:
    """The HTTP status of ``url/path`` with ``token`` (None: no answer within 2 s)."""
    req = urllib.request.Request(f"{url}/{path}", headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return int(resp.status)
    except (urllib.error.URLError, OSError):
        return None


def wait_for_status(
    url: str, token: str, proc: subprocess.Popen, log: Path, timeout_s: float
) -> None:
    """Wait until the server ``proc`` (its output in ``log``) answers ``/api/status``;
    ``RuntimeError`` with the end of its log when it exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        if status(url, token) == 200:
            return
        time.sleep(0.25)
    raise RuntimeError(
        f"jupyter lab did not answer /api/status in time:\n{log.read_text()[-3000:]}"
    )


def stop(proc: subprocess.Popen) -> None:
    """Terminate the server, killing it if it has not exited within 20 s."""
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
