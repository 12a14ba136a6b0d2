"""``python -m traceml_nb check``: the CI regression gate on the run store.

::

    python -m traceml_nb check --name NAME [--store PATH] [--max-slowdown 0.10]
                               [--against baseline|RUN_ID] [--any-hardware]
                               [--format text|markdown] [--junit FILE]

Exit codes: 0 no regression, 1 a regression beyond the allowed slowdown and the baseline's
noise, 2 no baseline yet, a partial ``torchrun`` job (a rank failed or stored no run), a usage
error or a store that cannot be read. When the latest run of NAME is a rank of a ``torchrun``
job, the job is judged: its slowest rank against the slowest ranks of earlier whole jobs. The
GPU self-check is ``python -m traceml_nb.selfcheck``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a fraction such as 0.10, got {text!r}") from None
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError(f"must be a fraction such as 0.10, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m traceml_nb", description=__doc__.split("\n")[0])
    commands = top.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check",
        help="fail (exit 1) when the latest stored run of NAME is slower than its baseline",
        description="Compare the latest stored run of NAME with its baseline (a torchrun "
        "job: its slowest rank with the slowest ranks of earlier whole jobs). Exit 0: no "
        "regression; 1: a regression beyond --max-slowdown and the baseline's noise; 2: no "
        "baseline yet, a partial job, a usage error or an unreadable store.",
    )
    check.add_argument("--name", required=True, help="the run name (%%%%traceml --name NAME)")
    check.add_argument(
        "--store",
        metavar="PATH",
        help="the store (default: TRACEML_NB_STORE, else the user data directory)",
    )
    check.add_argument(
        "--max-slowdown",
        type=_fraction,
        default=None,
        metavar="FRACTION",
        help="allowed slowdown of the median step time (default 0.10 = 10%%)",
    )
    check.add_argument(
        "--against",
        default="baseline",
        metavar="baseline|RUN_ID",
        help="the baseline (default) or one stored run id, e.g. 17 or @17 (a rank of a job: "
        "that job)",
    )
    check.add_argument(
        "--any-hardware",
        action="store_true",
        help="let the baseline come from another hardware class",
    )
    check.add_argument(
        "--history",
        action="store_true",
        help="report the latest shift of NAME's step time over its stored history (change "
        "points) and what came with it; exit 1 when it is a slowdown beyond --max-slowdown, "
        "2 when the history is too short",
    )
    check.add_argument("--format", choices=("text", "markdown"), default="text")
    check.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")
    return top


def _check_history(args: argparse.Namespace) -> int:
    """``check --history``: the latest shift of the name's stored step time."""
    from .analysis.thresholds import DEFAULT_MAX_SLOWDOWN
    from .session.shifts import check_history
    from .views.shifts import HistoryCheckReport

    slowdown = DEFAULT_MAX_SLOWDOWN if args.max_slowdown is None else args.max_slowdown
    report = HistoryCheckReport(check_history(args.name, store=args.store, max_slowdown=slowdown))
    print(report.markdown() if args.format == "markdown" else report.text())
    if args.junit:
        try:
            report.write_junit(args.junit)
        except OSError as exc:
            print(f"traceml_nb check: cannot write {args.junit}: {exc}", file=sys.stderr)
            return 2
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = parser().parse_args(argv)  # a usage error exits 2, as argparse does
    if args.command == "check" and args.history:
        return _check_history(args)
    from .analysis.thresholds import DEFAULT_MAX_SLOWDOWN
    from .session.check import check
    from .views.check import CheckReport

    report = CheckReport(
        check(
            args.name,
            store=args.store,
            max_slowdown=DEFAULT_MAX_SLOWDOWN if args.max_slowdown is None else args.max_slowdown,
            against=args.against,
            any_hardware=args.any_hardware,
        )
    )
    print(report.markdown() if args.format == "markdown" else report.text())
    if args.junit:
        try:
            report.write_junit(args.junit)
        except OSError as exc:
            print(f"traceml_nb check: cannot write {args.junit}: {exc}", file=sys.stderr)
            return 2
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
