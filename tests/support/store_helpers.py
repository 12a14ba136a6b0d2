"""Runs for the store's tests: real analyses of hand-built records, as the session keeps them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from builders import RecordBuilder, cpu_capabilities

from traceml_nb.analysis import analyze
from traceml_nb.session.history import RunEntry, entry_from

REPO = Path(__file__).resolve().parents[2]

ENV = {
    "gpu_name": None,
    "torch_version": "2.3.1",
    "python_version": "3.11.7",
    "traceml_nb_version": "0.1.0",
    "cpu_model": "Test CPU",
    "cpus_available": 2,
    "cpu_count": 2,
    "host_hash": "abc",
    "git_commit": None,
    "git_dirty": None,
    "dataset_type": "TensorDataset",
    "dataset_len": 96,
}


def make_run(
    name: str = "smoke",
    *,
    step_ms: float = 20.0,
    steps: int = 60,
    jitter: float = 0.01,
    seed: int = 0,
    source: str = "train(loader)\n",
    env: dict | None = None,
    load: float | None = 0.0,
    status: str = "completed",
    num_workers: int = 0,
    wait_ms: float = 1.0,
    batch_size: int = 8,
) -> RunEntry:
    """A run of ``steps`` steps of about ``step_ms`` (± ``jitter`` relative, seeded), each
    waiting ``wait_ms`` for its batch of ``batch_size`` samples."""
    rng = np.random.default_rng(seed)
    walls = step_ms * (1 + jitter * rng.standard_normal(steps))
    b = RecordBuilder()
    b.loader(num_workers=num_workers, batch_size=batch_size, dataset_len=96)
    b.steps(steps, walls, wait_ms, batch=batch_size)
    record = b.finish()
    analysis = analyze(record, cpu_capabilities(), cpus_available=2)
    run = SimpleNamespace(
        name=name,
        named=True,
        status=status,
        error=None if status == "completed" else "KeyboardInterrupt",
        started_at=1_700_000_000.0,
        elapsed_s=record.elapsed_ns / 1e9,
        record=record,
        cell_id=None,
        source=source,
    )
    entry = entry_from(run, analysis)
    entry.environment = dict(ENV if env is None else env)
    entry.load = {"other_cpu_share": load}
    return entry


def python(code: str, *, env: dict | None = None, timeout: float = 300, cwd: str | None = None):
    """Run ``code`` in a fresh Python of this virtualenv; the completed process."""
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
        cwd=cwd or str(REPO),
        check=False,
    )


def make_read_only(path) -> None:
    """A file this process cannot write: chmod for a user, the immutable flag for root."""
    if os.geteuid() != 0:
        os.chmod(path, 0o444)
        os.chmod(os.path.dirname(path), 0o555)
        return
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot make a file read-only as root here: {done.stderr!r}")


def undo_read_only(path) -> None:
    if os.geteuid() != 0:
        os.chmod(os.path.dirname(path), 0o755)
        os.chmod(path, 0o644)
    else:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m traceml_nb ARGS`` in a subprocess (``env`` added to this one's)."""
    return subprocess.run(
        [sys.executable, "-m", "traceml_nb", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        env={**os.environ, **(env or {})},
        check=False,
    )


def train(session, name: str, *, during=None):
    """A short real run of ``name`` in ``session`` (``during``: called while it trains); its
    result."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session.run(name, sample=False) as run:
        for i, (x, y) in enumerate(DataLoader(ds, batch_size=4)):
            time.sleep(0.002)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if i == 2 and during is not None:
                during()
    return run.result()
