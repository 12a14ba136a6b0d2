"""Shared fixtures. The autouse ``no_leaks`` check fails any test that leaves behind a thread,
a hook, a patched method or an active run of ours; the autouse ``run_store`` gives each test
its own run store (and profile trace directory), so no test writes to the user's data directory
or sees another's runs."""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
#: torch's intra-op threads, for this process and every kernel, rank and job the tests start.
#: With one thread per core, a core taken by other work on the machine stalls each parallel
#: region: a 10 ms CPU step then takes 60-80 ms (the demo 69 s instead of 16 s with one core
#: busy). One thread keeps the suite's time and noise the same on a quiet and a busy machine;
#: a test that is about threads sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: For the whole session (module fixtures, kernels and servers started by tests inherit it):
#: never the user's ``~/.local/share/traceml_nb``.
_SESSION_STORE_DIR = tempfile.mkdtemp(prefix="traceml-test-store-")
atexit.register(shutil.rmtree, _SESSION_STORE_DIR, ignore_errors=True)
os.environ["TRACEML_NB_STORE"] = os.path.join(_SESSION_STORE_DIR, "runs.sqlite")

#: The fixtures' and builders' modules (``from builders import ...``), for the tests and for
#: what they start (spawned ranks get the parent's path).
SUPPORT = Path(__file__).resolve().parent / "support"
sys.path.insert(0, str(SUPPORT))

from leakcheck import force_clean, leak_report  # noqa: E402

from traceml_nb.views.frontend import PYCHARM_VARIABLE, VSCODE_VARIABLES  # noqa: E402

#: The frontend is told from these: a suite started from a VS Code or PyCharm terminal must not
#: make the kernels it starts theirs.
for _frontend_variable in (*VSCODE_VARIABLES, PYCHARM_VARIABLE):
    os.environ.pop(_frontend_variable, None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What importing the test modules built (torch, the trainers, IPython: ~0.45 M objects)
    lives to the end: kept out of every later collection (``gc.freeze``), which otherwise
    walks it each time, in the tests' explicit collections and in the automatic ones inside
    the loops they run in this process."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def no_leaks():
    yield
    problems = leak_report()
    if problems:
        force_clean()
        pytest.fail("traceml_nb left state behind: " + "; ".join(problems))


@pytest.fixture(autouse=True)
def run_store(tmp_path, monkeypatch):
    """This test's own run store (``TRACEML_NB_STORE``), in its tmp directory, and its own
    directory of profile traces (``TRACEML_NB_PROFILE_DIR``)."""
    path = tmp_path / "traceml-runs.sqlite"
    monkeypatch.setenv("TRACEML_NB_STORE", str(path))
    monkeypatch.setenv("TRACEML_NB_PROFILE_DIR", str(tmp_path / "traceml-profiles"))
    return path


@pytest.fixture
def cpu_only_torch():
    """Torch as it is here (CPU build); the test asserts that."""
    import torch

    assert not torch.cuda.is_available()
    return torch
