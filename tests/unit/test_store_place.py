"""Where the store lives: a store on a network or FUSE filesystem (told from a mount table the
test writes) uses the rollback journal and retries a failed write once; a store that a Colab or
Kaggle runtime would lose gets one line saying how to keep the runs."""

from __future__ import annotations

import sqlite3

import pytest
from store_helpers import make_run

from traceml_nb.session import store_place
from traceml_nb.session.store import Store, StoreError
from traceml_nb.session.store_place import (
    COLAB_DRIVE_STORE,
    KAGGLE_STORE,
    filesystem_of,
    is_network_filesystem,
    lost_with_the_runtime,
)


def mount_table(tmp_path, *lines: str) -> str:
    path = tmp_path / "mounts"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_the_longest_mount_point_names_the_filesystem(tmp_path):
    table = mount_table(
        tmp_path,
        "/dev/sda1 / ext4 rw,relatime 0 0",
        "drive /content/drive fuse.drive rw,nosuid 0 0",
        "server:/export /mnt/nfs nfs4 rw 0 0",
        "/dev/sdb1 /mnt/with\\040space ext4 rw 0 0",
        "garbage",
    )
    assert filesystem_of("/content/drive/MyDrive/traceml/runs.sqlite", table) == "fuse.drive"
    assert filesystem_of("/content/drive", table) == "fuse.drive"
    assert filesystem_of("/content/driveX/runs.sqlite", table) == "ext4"  # not under the mount
    assert filesystem_of("/mnt/nfs/team/runs.sqlite", table) == "nfs4"
    assert filesystem_of("/mnt/with space/runs.sqlite", table) == "ext4"
    assert filesystem_of("/home/me/runs.sqlite", table) == "ext4"
    assert filesystem_of("/home/me/runs.sqlite", str(tmp_path / "no-such-table")) is None


def test_network_and_fuse_types_on_both_sides():
    for fstype in ("fuse", "fuse.drive", "fuse.sshfs", "nfs", "nfs4", "cifs", "smb3", "9p"):
        assert is_network_filesystem(fstype), fstype
    for fstype in ("ext4", "xfs", "btrfs", "tmpfs", "overlay", "fuseblk-ish", "", None):
        assert not is_network_filesystem(fstype), fstype


def journal_of(path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchall()[0][0])
    finally:
        conn.close()


def test_a_store_on_fuse_uses_the_rollback_journal_and_stores(tmp_path, monkeypatch):
    folder = tmp_path / "drive"
    folder.mkdir()
    table = mount_table(tmp_path, "/dev/sda1 / ext4 rw 0 0", f"drive {folder} fuse.drive rw 0 0")
    monkeypatch.setattr(store_place, "MOUNTS_FILE", table)
    on_drive = Store(folder / "runs.sqlite")
    on_drive.add(make_run())
    on_drive.add(make_run(seed=1))
    assert on_drive.network is True
    assert journal_of(on_drive.path) == "delete"
    assert len(on_drive.rows(name="smoke")) == 2
    local = Store(tmp_path / "runs.sqlite")
    local.add(make_run())
    assert local.network is False and journal_of(local.path) == "wal"


def test_a_wal_store_moved_onto_fuse_is_switched_to_the_rollback_journal(tmp_path, monkeypatch):
    folder = tmp_path / "drive"
    folder.mkdir()
    Store(folder / "runs.sqlite").add(make_run())  # made as a local store: WAL
    assert journal_of(folder / "runs.sqlite") == "wal"
    table = mount_table(tmp_path, f"drive {folder} fuse.drive rw 0 0")
    monkeypatch.setattr(store_place, "MOUNTS_FILE", table)
    store = Store(folder / "runs.sqlite")
    store.add(make_run(seed=1))
    assert journal_of(store.path) == "delete" and len(store.rows(name="smoke")) == 2


@pytest.mark.parametrize(
    ("network", "failures", "stored"), [(True, 1, True), (True, 2, False), (False, 1, False)]
)
def test_a_failed_write_on_a_network_filesystem_is_retried_once(
    tmp_path, monkeypatch, network, failures, stored
):
    store = Store(tmp_path / "runs.sqlite")
    store.network = network
    real = Store._insert
    calls = []

    def flaky(self, entries, session):
        calls.append(1)
        if len(calls) <= failures:
            raise StoreError("the store failed: disk I/O error")
        return real(self, entries, session)

    monkeypatch.setattr(Store, "_insert", flaky)
    monkeypatch.setattr("traceml_nb.session.store.NETWORK_RETRY_S", 0.0)
    if stored:
        assert store.add(make_run()) == 1
    else:
        with pytest.raises(StoreError, match="disk I/O error"):
            store.add(make_run())
    assert len(calls) == (min(failures, 1) + 1 if network else 1)


def test_a_store_a_hosted_runtime_would_lose_gets_one_line_saying_how_to_keep_it():
    colab = {"COLAB_RELEASE_TAG": "release-colab-2026"}
    default = "/root/.local/share/traceml_nb/runs.sqlite"
    line = lost_with_the_runtime(default, colab, {})
    assert line is not None and default in line and "Colab" in line
    assert line.endswith(f"%env TRACEML_NB_STORE={COLAB_DRIVE_STORE}")
    assert lost_with_the_runtime(default, {}, {"google.colab": object()}) == line
    assert lost_with_the_runtime(COLAB_DRIVE_STORE, colab, {}) is None
    assert lost_with_the_runtime("/content/runs.sqlite", colab, {}) is not None  # not on Drive

    kaggle = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}
    line = lost_with_the_runtime(default, kaggle, {})
    assert line is not None and line.endswith(f"%env TRACEML_NB_STORE={KAGGLE_STORE}")
    assert lost_with_the_runtime(KAGGLE_STORE, kaggle, {}) is None
    assert lost_with_the_runtime(default, {}, {}) is None  # a laptop, a CI job: nothing said
