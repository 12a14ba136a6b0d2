"""A throwaway PostgreSQL cluster for the tests: ``initdb`` in a temporary directory, run as a
non-root user (``initdb`` refuses root; as root the tests use ``nobody``), listening on a Unix
socket in that directory only (``listen_addresses=''``), trust authentication for
:data:`ADMIN` and a password for :data:`SECRET_USER`; ``fsync`` off, so that it starts in about
a second. Stopped and removed at the end, however the run ends (the session fixture's finalizer,
and ``atexit`` for an interrupted run).
"""

from __future__ import annotations

import atexit
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

#: The superuser (trust authentication on the socket).
ADMIN = "postgres"
#: A role that must give its password, and that password (what no output may show).
SECRET_USER = "runs_writer"
SECRET_PASSWORD = "Zq8-secret-Xv3"
#: The user the server runs as when the tests run as root.
SERVER_USER = "nobody"


def binaries() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest
    /usr/lib/postgresql/*/bin; None when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    folders = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2] or 0)
    )
    for folder in reversed(folders):
        if os.path.exists(os.path.join(folder, "initdb")):
            return Path(folder)
    return None


class Cluster:
    """A running throwaway cluster; :meth:`url` of a new database each call."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="tml-pg-"))
        self.data = self.root / "data"
        self.socket_dir = str(self.root)
        self.log = self.root / "server.log"
        self._numbers = itertools.count(1)
        self.running = False
        self._user = None if os.geteuid() != 0 else pwd.getpwnam(SERVER_USER)
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            user=self._user.pw_uid if self._user else None,
            group=self._user.pw_gid if self._user else None,
            cwd=self.root,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stderr or done.stdout}")
        return done

    def start(self) -> Cluster:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            ADMIN,
            "--auth=trust",
            "--no-sync",
            "--encoding=UTF8",
            "--locale=C",
        )
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"local all {SECRET_USER} scram-sha-256\nlocal all all trust\n")
        self.start_server()
        self.admin(f"CREATE ROLE {SECRET_USER} LOGIN PASSWORD '{SECRET_PASSWORD}' CREATEDB")
        return self

    def start_server(self) -> None:
        options = (
            f"-k {self.socket_dir} -c listen_addresses='' -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=60"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "start")
        self.running = True

    def stop_server(self) -> None:
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.running = False

    def close(self) -> None:
        try:
            self.stop_server()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def admin(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(statement)

    def server_ids(self) -> tuple[int, int]:
        """The ``(uid, gid)`` the server runs as (what must own a tablespace's folder)."""
        if self._user is not None:
            return self._user.pw_uid, self._user.pw_gid
        return os.getuid(), os.getgid()

    def url(self, database: str, user: str = ADMIN, password: str | None = None) -> str:
        """A URL of ``database`` on the socket (``password`` in it when given)."""
        who = f"{user}:{password}" if password else user
        return f"postgresql://{who}@/{database}?host={self.socket_dir}"

    def new_database(self, owner: str = ADMIN) -> str:
        """A new, empty database's name."""
        name = f"runs_{os.getpid()}_{next(self._numbers)}"
        self.admin(f"CREATE DATABASE {name} OWNER {owner}")
        return name


def start_cluster() -> Cluster | str:
    """A started cluster, or why there is none (no PostgreSQL, no psycopg)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'traceml_nb[postgres]')"
    bin_dir = binaries()
    if bin_dir is None:
        return "PostgreSQL is not installed (no initdb; scripts/setup.sh --test installs it)"
    cluster = Cluster(bin_dir)
    atexit.register(cluster.close)
    cluster.start()
    return cluster
