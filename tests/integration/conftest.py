"""Fixtures of the integration tier: the throwaway PostgreSQL server (tests/support/postgres.py),
started once for the whole run on its first use and stopped at its end; and each test's
process left as though nothing had been compiled."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _forget_compiles():
    """After a test that compiled with ``torch.compile``, the compile caches and dynamo's
    counters are cleared: a run counts no FLOPs in a process that compiled anything (counting
    would compile again), so one compiling test would otherwise switch the FLOP count off for
    every test after it, unlike a user's process that never compiled."""
    yield
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None and utils.counters["stats"].get("unique_graphs"):
        import torch

        torch._dynamo.reset()
        utils.counters.clear()


@pytest.fixture(scope="session")
def postgres_cluster():
    """A running throwaway cluster; its tests skip, saying why, where PostgreSQL or psycopg is
    not installed."""
    from postgres import start_cluster

    cluster = start_cluster()
    if isinstance(cluster, str):
        pytest.skip(cluster)
    try:
        yield cluster
    finally:
        cluster.close()
