"""A stored run as rows: the columns ``%traceml history --all`` lists (:class:`StoredRow`), a
name's totals, a :class:`~.history.RunEntry` written as a row (:func:`row_of`, every float
finite or NULL, the JSON columns compact) and read back (:func:`entry_of`).
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis.findings import Diagnosis, Summary
from ..analysis.variants import values_of
from .environment import hardware_class
from .history import RunEntry
from .store_schema import RUN_COLUMNS, share_or_null


@dataclass
class StoredRow:
    """One stored run as ``%traceml history --all`` lists it (no steps, no source)."""

    id: int  #: the store's run id (shown as ``@id``)
    name: str
    status: str
    started_at: float  #: epoch seconds
    elapsed_s: float
    hardware: str  #: :func:`~.environment.hardware_class`
    total_steps: int | None
    steady_steps: int | None
    step_ms_median: float | None
    samples_per_s: float | None
    data_wait_share: float | None
    gpu_util_median_pct: float | None
    verdict: str | None
    idle_gpu_s: float | None  #: idle accelerator seconds (None: CPU run or not measured)
    idle_cost_usd: float | None  #: their price (None: no price for this GPU)
    session: str | None
    session_run: int | None  #: the run's number in its session
    #: share 0..1 of the machine's CPU time the hypervisor took (steal time; None: not measured)
    steal_share: float | None = None
    #: the rank, world size and job id of a run in a ``torchrun`` job (schema 3; None: alone)
    rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    #: the run's configuration key and the share 0..1 of the CPUs other processes used (schema 4)
    config: str | None = None
    other_cpu_share: float | None = None

    @property
    def load(self) -> dict[str, float | None]:
        """The machine's load during the run as a run's ``load`` holds it (for
        :func:`~traceml_nb.analysis.noise.is_busy`)."""
        return {"other_cpu_share": self.other_cpu_share, "steal_share": self.steal_share}


@dataclass
class NameTotals:
    """A name's stored runs since a time: how many, and the idle GPU time they left."""

    name: str
    runs: int
    idle_gpu_s: float  #: sum over the runs that measured it
    idle_cost_usd: float  #: sum over the runs that had a price
    priced_runs: int


LIST_COLUMNS = (
    "id, name, status, started_at, elapsed_s, hardware, total_steps, steady_steps, "
    "step_ms_median, samples_per_s, data_wait_share, gpu_util_median_pct, verdict, "
    "idle_gpu_s, idle_cost_usd, session, session_run, steal_share, rank, world_size, job_id, "
    "config, other_cpu_share"
)


def finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return json.dumps(finite(value), allow_nan=False, separators=(",", ":"), default=str)


def row_of(e: RunEntry, session: str | None, columns: Sequence[str]) -> tuple[Any, ...]:
    """``e`` as the values of ``columns``, for an INSERT."""
    s, d = e.summary, e.diagnosis
    cost = e.cost or {}
    values = {
        "name": e.name,
        "named": int(e.named),
        "cell_id": e.cell_id,
        "status": e.status,
        "error": e.error,
        "started_at": float(e.started_at),
        "elapsed_s": float(e.elapsed_s),
        "hardware": hardware_class(e.environment),
        "session": session,
        "session_run": e.id or None,
        "total_steps": s.total_steps,
        "steady_steps": s.steady_steps,
        "step_ms_median": finite(s.step_ms_median),
        "samples_per_s": finite(s.samples_per_s),
        "data_wait_share": finite(s.data_wait_share),
        "gpu_util_median_pct": finite(s.gpu_util_median_pct),
        "verdict": d.verdict,
        "cause": d.cause,
        "idle_gpu_s": finite(cost.get("idle_gpu_s")),
        "idle_cost_usd": finite(cost.get("cost_usd")),
        "source": e.source,
        "summary": dumps(s.to_dict()),
        "diagnosis": dumps(d.to_dict()),
        "loaders": dumps(e.loaders),
        "environment": dumps(e.environment),
        "load": dumps({"load": e.load, "cost": e.cost}),
        "step_ms": array("f", e.step_ms).tobytes(),
        "steal_share": finite(e.load.get("steal_share")),
        "rank": e.rank,
        "world_size": e.world_size,
        "job_id": e.job_id,
        "config": e.configuration.key,
        "other_cpu_share": share_or_null(e.load.get("other_cpu_share")),
    }
    return tuple(values[c] for c in columns)


def batch_size_of(summary: str) -> int | None:
    """The median batch size in a stored summary (its JSON text): a positive integer, else
    None (not counted, or JSON that is not what was written)."""
    try:
        size = json.loads(summary).get("batch_size")
    except (ValueError, TypeError, AttributeError):
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        return None
    return size


def values_given_of(environment: str) -> dict[str, str]:
    """The values a run was given (:func:`~traceml_nb.analysis.variants.values_of`), from its
    stored environment (its JSON text); none where that is not what was written."""
    try:
        found = json.loads(environment)
    except (ValueError, TypeError):
        return {}
    return values_of(found) if isinstance(found, dict) else {}


def entry_of(row: Sequence[Any], columns: Sequence[str] = RUN_COLUMNS) -> RunEntry:
    """A row of ``id`` and ``columns`` (default: every column of the schema) read back
    into a :class:`~.history.RunEntry`."""
    data = dict(zip(("id", *columns), row, strict=True))
    extra = json.loads(data["load"])
    load = extra.get("load") or {}
    if data.get("steal_share") is not None:  # the column is the store's own record of it
        load["steal_share"] = float(data["steal_share"])
    steps = array("f")
    steps.frombytes(data["step_ms"])
    return RunEntry(
        id=int(data["id"]),
        name=data["name"],
        cell_id=data["cell_id"],
        source=data["source"],
        status=data["status"],
        error=data["error"],
        started_at=float(data["started_at"]),
        elapsed_s=float(data["elapsed_s"]),
        summary=Summary.from_dict(json.loads(data["summary"])),
        diagnosis=Diagnosis.from_dict(json.loads(data["diagnosis"])),
        step_ms=[float(v) for v in steps],
        loaders=json.loads(data["loaders"]),
        named=bool(data["named"]),
        environment=json.loads(data["environment"]),
        load=load,
        cost=extra.get("cost"),
        stored_id=int(data["id"]),
        origin="store",
        session_id=data["session"],
        rank=data["rank"],
        world_size=data["world_size"],
        job_id=data["job_id"],
    )
