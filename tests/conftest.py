"""Shared fixtures. The autouse ``no_leaks`` check fails any test that leaves behind a thread,
a hook, a patched method or an active run of ours."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

from leakcheck import force_clean, leak_report  # noqa: E402


@pytest.fixture(autouse=True)
def no_leaks():
    yield
    problems = leak_report()
    if problems:
        force_clean()
        pytest.fail("traceml_nb left state behind: " + "; ".join(problems))


@pytest.fixture
def cpu_only_torch():
    """Torch as it is here (CPU build); the test asserts that."""
    import torch

    assert not torch.cuda.is_available()
    return torch
