"""The candidate DataLoader settings, the memory guard and the line to paste: pure, no torch.

A :class:`Candidate` is one setting of ``num_workers``, ``prefetch_factor`` and ``pin_memory``.
``persistent_workers`` does not change how fast batches come once the workers run (it saves
their start-up at each later epoch), so it is not measured as a candidate: the recommendation
sets it with workers, and the start-up it saves is measured and shown apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..analysis.advice import SKORCH_DRIVERS, setting_name, takes
from .constants import MAX_TUNE_WORKERS, PREFETCH_CHOICES, RAM_SHARE

#: torch's ``prefetch_factor`` when a loader with workers is given none
TORCH_DEFAULT_PREFETCH = 2


@dataclass(frozen=True, order=True)
class Candidate:
    """One DataLoader setting tried. ``prefetch_factor`` is None without workers."""

    num_workers: int
    prefetch_factor: int | None = None
    pin_memory: bool = False

    @property
    def in_flight(self) -> int:
        """Batches this setting keeps loaded ahead: workers × prefetch_factor (1 without
        workers: the batch being made)."""
        return self.num_workers * (self.prefetch_factor or TORCH_DEFAULT_PREFETCH) or 1

    @property
    def cost(self) -> tuple[int, int, bool]:
        """What the setting costs, to order candidates cheapest first: workers (processes, CPU
        share, copies of the dataset), then batches in flight (memory), then pinning."""
        return (self.num_workers, self.in_flight, self.pin_memory)

    @property
    def num_workers_label(self) -> str:
        """``1 worker``, ``2 workers``."""
        return f"{self.num_workers} worker{'s' if self.num_workers != 1 else ''}"

    @property
    def label(self) -> str:
        """``0 workers`` / ``2 workers, prefetch 4`` / ``2 workers, prefetch 4, pinned``."""
        text = self.num_workers_label
        if self.num_workers:
            text += f", prefetch {self.prefetch_factor}"
        if self.pin_memory:
            text += ", pinned"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worker_counts(cpus: int | None, chosen: Sequence[int] | None = None) -> list[int]:
    """The worker counts of the first round: ``chosen`` (``--workers``) as given, else 0 up to
    the CPUs this process may use (at most ``MAX_TUNE_WORKERS``; 2 when the CPUs are unknown)."""
    if chosen:
        return sorted({int(n) for n in chosen})
    top = min(cpus if cpus is not None else 2, MAX_TUNE_WORKERS)
    return list(range(0, max(top, 1) + 1))


def extra_worker_counts(cpus: int | None, tried: Sequence[int]) -> list[int]:
    """Worker counts past the CPUs, tried when the workers measured idle-waiting: up to twice
    the CPUs, at most ``MAX_TUNE_WORKERS``, those not tried yet."""
    if not cpus:
        return []
    top = min(2 * cpus, MAX_TUNE_WORKERS)
    return [n for n in range(max(tried, default=0) + 1, top + 1) if n not in tried]


def first_round(
    counts: Sequence[int], *, gpu: bool, prefetch: Sequence[int] | None = None
) -> list[Candidate]:
    """One candidate per worker count, with the first prefetch choice (torch's default 2),
    pinned when a GPU is used. The other prefetch and pinning choices are tried in the next
    round for the worker counts that survive the first (:func:`variants`)."""
    first = (prefetch or PREFETCH_CHOICES)[0]
    return [Candidate(n, first if n else None, gpu) for n in counts]


def variants(
    survivor: Candidate, *, gpu: bool, prefetch: Sequence[int] | None = None
) -> list[Candidate]:
    """The other settings of a surviving worker count: each prefetch choice and, on a GPU,
    pinned and not."""
    pins = (True, False) if gpu else (False,)
    factors: Sequence[int | None] = (
        (prefetch or PREFETCH_CHOICES) if survivor.num_workers else (None,)
    )
    out = [Candidate(survivor.num_workers, f, p) for f in factors for p in pins]
    return [c for c in out if c != survivor]


def in_flight_bytes(candidate: Candidate, batch_bytes: int) -> int:
    """The memory the candidate's batches in flight take: ``in_flight`` × one batch, twice
    with pinning (the pinned copy beside the worker's)."""
    return candidate.in_flight * batch_bytes * (2 if candidate.pin_memory else 1)


def memory_guard(
    candidate: Candidate, batch_bytes: int | None, available: int | None
) -> str | None:
    """Why ``candidate`` is skipped for its memory (None: it fits, or nothing tells). It is
    skipped when its batches in flight would take more than ``RAM_SHARE`` of the ``available``
    RAM (bytes)."""
    if not batch_bytes or not available or available <= 0:
        return None
    need = in_flight_bytes(candidate, batch_bytes)
    if need <= RAM_SHARE * available:
        return None
    return (
        f"its {candidate.in_flight} batches in flight would take {fmt_bytes(need)}, more than "
        f"{RAM_SHARE:.0%} of the {fmt_bytes(available)} of RAM available"
    )


def fmt_bytes(n: float) -> str:
    """``512 KiB``, ``3.1 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{int(n)} B"


@dataclass
class LoaderSpec:
    """The user's loader as the line to paste writes it: its arguments other than the tuned
    ones, each the source text of its value (``dataset`` the name it has in the notebook)."""

    dataset: str = "dataset"
    #: the other arguments in the order a DataLoader call writes them, e.g.
    #: ``[("batch_size", "32"), ("shuffle", "True"), ("collate_fn", "pad")]``
    arguments: list[tuple[str, str]] = field(default_factory=list)
    iterable: bool = False
    #: what built the loader: ``LoaderInfo.driver`` (None: the user's own DataLoader)
    driver: str | None = None
    #: the loader trains (``LoaderInfo.is_training``); an evaluation's or a prediction's
    #: settings are named apart by some trainers (``advice.setting_name``)
    trains: bool = True


#: Where a trainer builds the training DataLoader from arguments of its own
#: (``LoaderInfo.driver``): the call the tuned settings go into, by their names there
#: (``advice.setting_name``), beside the user's other arguments.
ARGUMENTS_OF = {"transformers": "TrainingArguments", **dict.fromkeys(SKORCH_DRIVERS, "NeuralNet")}


def paste_line(spec: LoaderSpec, candidate: Candidate, *, persistent: bool = True) -> str:
    """``DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True,
    prefetch_factor=4)``: the user's arguments, then the tuned ones (torch's defaults left
    out). Where a trainer builds the loader (:data:`ARGUMENTS_OF`), the tuned ones as it names
    them: ``TrainingArguments(…, dataloader_num_workers=2, …)``."""
    tuned = []
    if candidate.num_workers:
        tuned.append(("num_workers", candidate.num_workers))
    if candidate.pin_memory:
        tuned.append(("pin_memory", True))
    if candidate.num_workers and persistent and takes(spec.driver, "persistent_workers"):
        tuned.append(("persistent_workers", True))
    if candidate.num_workers and candidate.prefetch_factor not in (None, TORCH_DEFAULT_PREFETCH):
        tuned.append(("prefetch_factor", candidate.prefetch_factor))
    call = ARGUMENTS_OF.get(spec.driver or "")
    if call is not None:
        args = ["\u2026", *(f"{setting_name(k, spec.driver, spec.trains)}={v}" for k, v in tuned)]
        return f"{call}({', '.join(args)})"
    args = [spec.dataset, *(f"{k}={v}" for k, v in spec.arguments)]
    return f"DataLoader({', '.join([*args, *(f'{k}={v}' for k, v in tuned)])})"


def same_settings(candidate: Candidate, loader: dict[str, Any]) -> bool:
    """Whether a run's training loader (``LoaderInfo.to_dict()``) has ``candidate``'s settings."""
    workers = int(loader.get("num_workers") or 0)
    if workers != candidate.num_workers or bool(loader.get("pin_memory")) != candidate.pin_memory:
        return False
    if not workers:
        return True
    factor = loader.get("prefetch_factor") or TORCH_DEFAULT_PREFETCH
    return factor == (candidate.prefetch_factor or TORCH_DEFAULT_PREFETCH)
