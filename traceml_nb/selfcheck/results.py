"""What every check shares: its result, the statuses, the final table, the JSON report, the
time budget and the watchdog that ends a self-check stuck past that budget.

Nothing here imports torch: the verdict logic is tested on machines without a GPU.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PASS = "PASS"
FAIL = "FAIL"
WARN = "WARN"  #: worth a look, does not fail the self-check
INFO = "INFO"
SKIP = "SKIP"
ERROR = "ERROR"  #: the check itself crashed: counts as a failure
FAILING = (FAIL, ERROR)

DEFAULT_BUDGET_S = 170.0
WATCHDOG_GRACE_S = 25.0  #: past budget + grace, partial results are written and we exit 1


@dataclass
class CheckResult:
    """The outcome of one check; ``details`` holds its numbers (JSON-serialisable)."""

    name: str
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def exit_code(results: Sequence[CheckResult]) -> int:
    """1 when any check failed or crashed, else 0."""
    return 1 if any(r.status in FAILING for r in results) else 0


def format_table(results: Sequence[CheckResult]) -> str:
    """The final table: one line per check."""
    lines = [f"{'check':<10} {'status':<6} {'seconds':>7}  summary"]
    for r in results:
        lines.append(f"{r.name:<10} {r.status:<6} {r.seconds:>7.1f}  {r.summary}")
    failed = [r.name for r in results if r.status in FAILING]
    lines.append("result: " + (f"FAILED ({', '.join(failed)})" if failed else "all checks passed"))
    return "\n".join(lines)


class Budget:
    """A deadline ``seconds`` from now (monotonic clock)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._deadline = clock() + seconds

    def remaining(self) -> float:
        return self._deadline - self._clock()

    def allows(self, seconds: float) -> bool:
        """True when ``seconds`` more still fit in the budget."""
        return self.remaining() >= seconds


def run_check(
    name: str, check: Callable[[Budget], CheckResult], budget: Budget, needs_s: float
) -> CheckResult:
    """Run one check; a crash becomes an ERROR result, a lack of time a SKIP."""
    if not budget.allows(needs_s):
        return CheckResult(
            name, SKIP, f"not enough of the time budget left ({budget.remaining():.0f} s)"
        )
    t0 = time.monotonic()
    try:
        result = check(budget)
    except Exception as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        result = CheckResult(name, ERROR, f"{type(exc).__name__}: {exc}", {"traceback": tb})
    result.seconds = time.monotonic() - t0
    return result


def report_dict(results: Sequence[CheckResult], budget_s: float, note: str = "") -> dict[str, Any]:
    """The JSON report: when, the budget, an optional note, the exit code and every result."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "budget_s": budget_s,
        "note": note,
        "exit_code": exit_code(results),
        "checks": [asdict(r) for r in results],
    }


def write_json(path: str | None, report: dict[str, Any]) -> None:
    """Write ``report`` to ``path`` (nothing when ``path`` is empty); a failure is printed, not
    raised, so the table still ends the output."""
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=2, default=str)
    except OSError as exc:
        print(f"could not write {path}: {exc}", file=sys.stderr, flush=True)


class Watchdog:
    """Ends the process with exit code 1 when the checks run ``WATCHDOG_GRACE_S`` past their
    budget (a hung CUDA call or child process cannot be interrupted from Python): it appends an
    ERROR result for the check that was running, prints the table and writes the JSON report
    with what was measured so far.

    ``results`` is the list the driver appends to; ``current`` is set to the name of the check
    that is running.
    """

    def __init__(self, budget_s: float, results: list[CheckResult], json_path: str | None) -> None:
        self.budget_s = budget_s
        self.results = results
        self.json_path = json_path
        self.current = "start"
        self._timer = threading.Timer(budget_s + WATCHDOG_GRACE_S, self._on_timeout)
        self._timer.name = "selfcheck-watchdog"
        self._timer.daemon = True

    def _on_timeout(self) -> None:
        msg = (
            f"time budget exceeded by {WATCHDOG_GRACE_S:.0f} s while running "
            f"{self.current!r}; giving up"
        )
        print(msg, flush=True)
        self.results.append(CheckResult(self.current, ERROR, msg))
        print(format_table(self.results), flush=True)
        write_json(self.json_path, report_dict(self.results, self.budget_s, msg))
        os._exit(1)

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()
