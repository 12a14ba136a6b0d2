"""Where the store's file lives, and what that means for it.

* **A network or FUSE filesystem** (a mounted Google Drive, NFS, SMB, 9p, sshfs), told from the
  mount table (``/proc/self/mounts``, :data:`MOUNTS_FILE`): SQLite's WAL journal needs memory
  shared between the processes of one host and locks such filesystems do not reliably give, so
  a store there uses the rollback journal (:func:`on_network_filesystem`).
* **A runtime that forgets its disk**: Colab gives each runtime a fresh machine, and Kaggle keeps
  only ``/kaggle/working`` (as a saved version's output). A store that would be lost with the
  runtime gets one line, once a session, saying how to keep the runs
  (:func:`lost_with_the_runtime`). Nothing is written anywhere the user did not choose.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: The mount table read to tell the filesystem a store is on (Linux; elsewhere none is read).
MOUNTS_FILE = "/proc/self/mounts"
#: Filesystem types on which the store uses the rollback journal instead of WAL (any
#: ``fuse.*`` type too: Colab's Drive is ``fuse.drive``, sshfs ``fuse.sshfs``).
NETWORK_FILESYSTEMS = frozenset(
    {"fuse", "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre"}
)
#: Where a Drive mounted in Colab lives, and the store path the note suggests there.
COLAB_DRIVE = "/content/drive"
COLAB_DRIVE_STORE = "/content/drive/MyDrive/traceml/runs.sqlite"
#: The one folder a Kaggle notebook keeps (a saved version's output), and the path suggested.
KAGGLE_KEPT = "/kaggle/working"
KAGGLE_STORE = "/kaggle/working/traceml/runs.sqlite"


def _unescape(field: str) -> str:
    """A mount table field, its octal escapes (``\\040`` for a space) undone."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and len(field) >= i + 4:
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_of(path: str, mounts_file: str | None = None) -> str | None:
    """The type of the filesystem ``path`` (a file that may not exist yet) is on: that of the
    longest mount point containing it; None where the mount table cannot be read."""
    try:
        with open(mounts_file or MOUNTS_FILE, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, fields[2]
    return best_type


def is_network_filesystem(fstype: str | None) -> bool:
    """A filesystem type of :data:`NETWORK_FILESYSTEMS`, or a FUSE one."""
    if not fstype:
        return False
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse.")


def on_network_filesystem(path: str, mounts_file: str | None = None) -> bool:
    """The store at ``path`` is on a network or FUSE filesystem (module docstring)."""
    return is_network_filesystem(filesystem_of(path, mounts_file))


def hosted_runtime(
    environ: Mapping[str, str] | None = None, modules: Mapping[str, object] | None = None
) -> str | None:
    """``"colab"`` (``google.colab`` imported, or Colab's ``COLAB_RELEASE_TAG``), ``"kaggle"``
    (``KAGGLE_KERNEL_RUN_TYPE`` set) or None."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if "google.colab" in modules or "COLAB_RELEASE_TAG" in environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in environ:
        return "kaggle"
    return None


def _under(path: str, folder: str) -> bool:
    path = os.path.abspath(path)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def lost_with_the_runtime(
    path: str,
    environ: Mapping[str, str] | None = None,
    modules: Mapping[str, object] | None = None,
) -> str | None:
    """One line when the store at ``path`` goes with the runtime (Colab outside a mounted
    Drive, Kaggle outside ``/kaggle/working``), saying how to keep the runs; else None."""
    runtime = hosted_runtime(environ, modules)
    if runtime == "colab" and not _under(path, COLAB_DRIVE):
        return (
            f"the run store {path} is on this Colab runtime's disk and goes when the runtime "
            "is reset; to keep runs across runtimes, mount Drive and run "
            f"%env TRACEML_NB_STORE={COLAB_DRIVE_STORE}"
        )
    if runtime == "kaggle" and not _under(path, KAGGLE_KEPT):
        return (
            f"the run store {path} is outside {KAGGLE_KEPT}, which is all a Kaggle notebook "
            f"keeps; to keep runs with the saved version, run %env TRACEML_NB_STORE={KAGGLE_STORE}"
        )
    return None
