"""Read a W&B offline run back from its files: the run's transaction log (``run-*.wandb``),
decoded with W&B's own record schema (``wandb.proto.wandb_internal_pb2.Record``), and its
``files/`` folder (media such as ``wandb.Html`` and tables).

The log is W&B's LevelDB-style log: a 7-byte header (``:W&B``, a magic number, a version),
then 32 KiB blocks of chunks, each with a 7-byte header (CRC-32C, length, type: full, first,
middle, last). The W&B client has no public reader for it since its core moved to Go.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending, out = HEADER, b"", []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
            pending = b""
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    """What an offline run holds: ``summary`` (the last value of each key), ``history`` (one
    dict a committed step), ``files`` (its ``files/`` folder)."""

    folder: Path
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None

    @property
    def files(self) -> Path:
        return self.folder / "files"


def read_offline_run(folder: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = folder.glob("run-*.wandb")
    run = OfflineRun(folder)
    for raw in raw_records(log):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "summary":
            for item in record.summary.update:
                run.summary[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(wandb_dir: Path) -> list[Path]:
    """The offline run folders under ``WANDB_DIR``, oldest first."""
    return sorted((wandb_dir / "wandb").glob("offline-run-*"))
