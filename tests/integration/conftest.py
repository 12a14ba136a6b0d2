"""Fixtures of the integration tier: the throwaway PostgreSQL server (tests/support/postgres.py),
started once for the whole run on its first use and stopped at its end."""

from __future__ import annotations

import pytest


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
