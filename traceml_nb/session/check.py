"""The CI gate: is the latest stored run of a name slower than its baseline?

:func:`check` reads the store (never writes it) and returns a :class:`CheckResult` whose
``exit_code`` is what ``python -m traceml_nb check`` exits with:

* **0** no regression: the latest run is not slower than its baseline by more than
  ``max_slowdown`` *and* the baseline's run-to-run noise *and* the step-level bootstrap;
* **1** a regression beyond all three;
* **2** no verdict: no run or no baseline yet, a latest run without steady steps, a usage
  error, or a store that cannot be read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..analysis.attribution import what_changed
from ..analysis.baseline import compare_with_baseline, is_regression
from ..analysis.comparison import Comparison, fmt_pct_plain
from ..analysis.formatting import fmt_ms, signed_pct
from ..analysis.thresholds import BASELINE_RUNS, DEFAULT_MAX_SLOWDOWN, MIN_BASELINE_RUNS
from .environment import hardware_class
from .history import RunEntry
from .store import Store, StoreError, resolve_store_path

EXIT_OK, EXIT_REGRESSION, EXIT_NO_VERDICT = 0, 1, 2
PASS, REGRESSION, NO_BASELINE, ERROR = "pass", "regression", "no baseline", "error"


@dataclass
class CheckResult:
    """The gate's outcome. ``status``: "pass", "regression", "no baseline" or "error";
    ``verdict``: one paragraph saying it; ``comparison`` the latest run against its baseline
    (None without one); ``max_slowdown`` the allowed slowdown, a fraction (0.10 = 10%)."""

    exit_code: int
    status: str
    name: str
    verdict: str
    max_slowdown: float
    store_path: str | None = None
    candidate: RunEntry | None = None
    baseline: list[RunEntry] = field(default_factory=list)
    comparison: Comparison | None = None
    changes: list[str] = field(default_factory=list)

    @property
    def slowdown(self) -> float | None:
        """The latest run's median step time relative to the baseline's, less 1 (0.2 = 20%
        slower), or None."""
        ratio = self.comparison.step_ratio if self.comparison is not None else None
        return None if ratio is None else ratio - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "status": self.status,
            "name": self.name,
            "verdict": self.verdict,
            "max_slowdown": self.max_slowdown,
            "store_path": self.store_path,
            "candidate": self.candidate.stored_id if self.candidate is not None else None,
            "baseline": [r.stored_id for r in self.baseline],
            "slowdown": self.slowdown,
            "comparison": self.comparison.to_dict() if self.comparison is not None else None,
            "changes": list(self.changes),
        }


def _fail(name: str, why: str, max_slowdown: float, path: str | None, status: str = ERROR) -> Any:
    return CheckResult(EXIT_NO_VERDICT, status, name, why, max_slowdown, path)


def check(
    name: str,
    *,
    store: str | os.PathLike[str] | None = None,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
    against: str | int = "baseline",
    any_hardware: bool = False,
) -> CheckResult:
    """Compare the latest stored run of ``name`` with its baseline (``against="baseline"``:
    the pinned runs, else the last ``BASELINE_RUNS`` completed runs of ``name`` on the same
    hardware class, or any class with ``any_hardware``) or with one stored run
    (``against=17`` or ``"@17"``). ``store``: a path, else ``TRACEML_NB_STORE`` / the default.
    Never raises for a store problem: that is exit code 2 with the reason."""
    if not (isinstance(max_slowdown, (int, float)) and 0 <= max_slowdown < 10):
        return _fail(
            name,
            f"--max-slowdown must be a fraction such as 0.10, got {max_slowdown!r}",
            DEFAULT_MAX_SLOWDOWN,
            None,
        )
    path = resolve_store_path(store)
    if path is None:
        return _fail(
            name,
            "storing is off (TRACEML_NB_STORE=off): there are no runs to check",
            max_slowdown,
            None,
        )
    target = Store(path)
    try:
        candidate = target.latest(name)
        if candidate is None:
            names = ", ".join(repr(n) for n in target.names()[:10]) or "none"
            return _fail(
                name,
                f"no stored run named {name!r} in {path} (names stored: {names})",
                max_slowdown,
                path,
                NO_BASELINE,
            )
        if against == "baseline":
            hardware = None if any_hardware else hardware_class(candidate.environment)
            baseline = target.baseline(
                name, hardware=hardware, before=candidate.stored_id, k=BASELINE_RUNS
            )
            baseline = [r for r in baseline if r.stored_id != candidate.stored_id]
        else:
            text = str(against).strip().lstrip("@")
            if not text.isdigit():
                return _fail(
                    name,
                    f"--against must be 'baseline' or a stored run id, got {against!r}",
                    max_slowdown,
                    path,
                )
            baseline = [target.get(int(text))]
    except StoreError as exc:
        return _fail(name, f"cannot read the store: {exc}", max_slowdown, path)
    if not baseline:
        where = "" if any_hardware else f" on {hardware_class(candidate.environment)}"
        return CheckResult(
            EXIT_NO_VERDICT,
            NO_BASELINE,
            name,
            f"no baseline yet for {name!r}{where}: @{candidate.stored_id} is its only "
            f"completed run there. Store {MIN_BASELINE_RUNS} or more runs of it (e.g. on the "
            "main branch) and the gate has a baseline whose noise it knows.",
            max_slowdown,
            path,
            candidate,
        )
    comparison = compare_with_baseline(baseline, candidate)
    changes = what_changed(baseline[-1], candidate, verdict=comparison.verdict).lines()
    comparison.changes = changes
    if comparison.step_ratio is None:
        return CheckResult(
            EXIT_NO_VERDICT, ERROR, name,
            f"no verdict on {name!r} @{candidate.stored_id}: {comparison.headline}.",
            max_slowdown, path, candidate, baseline, comparison, changes,
        )  # fmt: skip
    regression = is_regression(comparison, max_slowdown)
    return CheckResult(
        EXIT_REGRESSION if regression else EXIT_OK,
        REGRESSION if regression else PASS,
        name,
        verdict_paragraph(name, candidate, baseline, comparison, max_slowdown, regression),
        max_slowdown,
        path,
        candidate,
        baseline,
        comparison,
        changes,
    )


def verdict_paragraph(
    name: str,
    candidate: RunEntry,
    baseline: list[RunEntry],
    comparison: Comparison,
    max_slowdown: float,
    regression: bool,
) -> str:
    """The gate's verdict in one paragraph."""
    ids = [f"@{r.stored_id}" for r in baseline]
    of = (
        f"run {ids[0]}"
        if len(ids) == 1
        else f"the median of {len(ids)} runs {ids[0]}\u2013{ids[-1]}"
    )
    ratio = comparison.step_ratio
    noise = comparison.noise
    if ratio is None:
        return f"{name!r}: no verdict on @{candidate.stored_id}: {comparison.headline}."
    median_before = noise.center_ms if noise is not None and noise.center_ms else None
    if median_before is None or len(baseline) == 1:
        median_before = baseline[-1].summary.step_ms_median
    move = (
        f"{fmt_ms(median_before)} \u2192 {fmt_ms(candidate.summary.step_ms_median)} "
        f"({signed_pct(ratio - 1)})"
    )
    allowed = f"the {fmt_pct_plain(max_slowdown)} allowed"
    if noise is not None and noise.known:
        band = f"the run-to-run noise of the baseline (\u00b1{fmt_pct_plain(noise.margin)})"
    elif noise is not None:
        band = (
            f"the step-level bootstrap (the run-to-run noise is not known yet: "
            f"{noise.runs_needed} more baseline run{'s' if noise.runs_needed != 1 else ''} "
            "would tell)"
        )
    else:
        band = "the step-level bootstrap"
    what = list(comparison.changes[1:])
    changed = ""
    if what:
        changed = f" What changed: {'; '.join(what)}."
    elif comparison.changes:
        first = comparison.changes[0]
        changed = f" {first[:1].upper()}{first[1:]}"
    if regression:
        head = (
            f"REGRESSION: {name!r} @{candidate.stored_id} is slower than its baseline, "
            f"{of}: step time {move}, beyond {allowed} and beyond {band}."
        )
    elif comparison.verdict == "slower":
        head = (
            f"OK: {name!r} @{candidate.stored_id} is slower than {of} ({move}), beyond "
            f"{band} but within {allowed}."
        )
    else:
        head = (
            f"OK: {name!r} @{candidate.stored_id} against {of}: step time {move}, "
            f"{comparison.verdict} (judged against {allowed} and {band})."
        )
    return head + changed
