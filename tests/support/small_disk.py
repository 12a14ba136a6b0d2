"""A real full disk for the tests: a tmpfs of a few hundred KiB mounted over a test's folder
(as root: ``mount`` needs it), filled up to the last few KiB by a filler file that the test
removes to free it again."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The filesystem's size: room for a store and a few runs, nothing more.
SIZE_KIB = 512
#: Bytes left free once filled: less than a SQLite page and a PostgreSQL page (8 KiB) need.
LEFT_FREE = 2048


class SmallDisk:
    """A mounted tmpfs at :attr:`path`; :meth:`fill` and :meth:`free` its last bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        """Leave :data:`LEFT_FREE` bytes free (whatever was written so far)."""
        stat = os.statvfs(self.path)
        free = stat.f_bavail * stat.f_frsize
        with open(self.filler, "ab") as f:
            f.write(b"\0" * max(0, free - LEFT_FREE))

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@contextmanager
def small_disk(path: Path, owner: tuple[int, int] | None = None) -> Iterator[SmallDisk | str]:
    """A :class:`SmallDisk` mounted at ``path`` (made; owned by ``owner``, a ``(uid, gid)``),
    unmounted at the end; where it cannot be mounted, why (a string)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield "a small filesystem is mounted only as root (mount needs it)"
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_KIB}k,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        yield f"cannot mount a tmpfs here: {done.stderr.strip()}"
        return
    try:
        if owner is not None:
            os.chown(path, *owner)
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
