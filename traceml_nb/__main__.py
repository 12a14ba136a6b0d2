"""``python -m traceml_nb``: the CI gates (check, ab) and stored runs moved between stores.

``python -m traceml_nb check``, the CI regression gate on the run store::

    python -m traceml_nb check --name NAME [--store PATH] [--max-slowdown 0.10]
                               [--against baseline|RUN_ID] [--any-hardware] [--runs K]
                               [--format text|markdown] [--junit FILE]

Exit codes: 0 not slower (a slowdown of --max-slowdown is ruled out), 1 a regression (slower
with confidence, by at least half of --max-slowdown), 3 inconclusive (the run-to-run noise is
too wide to tell), 2 no baseline yet, a partial ``torchrun`` job (a rank failed or stored no
run), a usage error or a store that cannot be read. When the latest run of NAME is a rank of a
``torchrun`` job, the job is judged: its slowest rank against the slowest ranks of earlier
whole jobs. ``check --history``: the latest shift of the stored step time. The GPU self-check
is ``python -m traceml_nb.selfcheck``.

``python -m traceml_nb ab --name NAME --base REF -- COMMAND``: the same-job A/B gate
(:mod:`traceml_nb.session.ab`); exit 0 not slower, 1 slower, 2 no verdict, 3 inconclusive.

``python -m traceml_nb export [--name NAME] > runs.jsonl`` and ``import runs.jsonl``: stored
runs moved between stores, each run once (:mod:`traceml_nb.session.store_transfer`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

#: What ``python -m traceml_nb --help`` says the command line is for.
DESCRIPTION = (
    "traceml_nb's command line: the CI gates on stored runs (check) and on a base against the "
    "head in one job (ab), and stored runs moved between stores (export, import). The GPU "
    "self-check is python -m traceml_nb.selfcheck."
)
#: What ``--store`` takes.
STORE_HELP = (
    "the store: a SQLite file, or a server as postgresql://user@host:port/db "
    "(default: TRACEML_NB_STORE, else the user data directory)"
)

if TYPE_CHECKING:
    from .views.check_report import GateReport


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a fraction such as 0.10, got {text!r}") from None
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError(f"must be a fraction such as 0.10, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    from .analysis.thresholds import BASELINE_RUNS

    top = argparse.ArgumentParser(prog="python -m traceml_nb", description=DESCRIPTION)
    commands = top.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check",
        help="fail (exit 1) when the latest stored run of NAME is slower than its baseline",
        description="Compare the latest stored run of NAME with its baseline (a torchrun "
        "job: its slowest rank with the slowest ranks of earlier whole jobs). Exit 0: not "
        "slower; 1: a regression (slower with confidence, by at least half of "
        "--max-slowdown); 3: inconclusive (the noise is too wide to tell); 2: no baseline "
        "yet, a partial job, a usage error or an unreadable store.",
    )
    check.add_argument("--name", required=True, help="the run name (%%%%traceml --name NAME)")
    check.add_argument(
        "--store",
        metavar="PATH|URL",
        help=STORE_HELP,
    )
    check.add_argument(
        "--max-slowdown",
        type=_fraction,
        default=None,
        metavar="FRACTION",
        help="the slowdown of the median step time to catch (default 0.10 = 10%%)",
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
        "--runs",
        type=int,
        default=1,
        metavar="K",
        help="judge the latest K runs of NAME together (the job trained K times in a row): "
        "their mean against the baseline of the first, with the noise of one K times smaller "
        "(default 1)",
    )
    check.add_argument(
        "--baseline-runs",
        type=int,
        default=BASELINE_RUNS,
        metavar="N",
        help=f"the baseline: the last N runs of the configuration (default {BASELINE_RUNS}); "
        "more runs know the noise better, and with --runs K catch a smaller slowdown",
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
    _add_ab(commands)
    _add_transfer(commands)
    return top


def _add_transfer(commands: Any) -> None:
    """``export`` and ``import``: stored runs moved between stores
    (:mod:`.session.store_transfer`)."""
    export = commands.add_parser(
        "export",
        help="write the stored runs of NAME (every run without --name) as JSON lines to stdout",
        description="Write the stored runs of NAME (every run without --name), oldest first, "
        "as JSON lines to stdout, for import into another store.",
    )
    export.add_argument("--name", help="the run name (default: every run)")
    export.add_argument("--store", metavar="PATH|URL", help=STORE_HELP)
    imported = commands.add_parser(
        "import",
        help="add the runs of an exported JSON lines FILE to the store, each run once",
        description="Add the runs of FILE (written by export; - for stdin) to the store. A run "
        "already there (the same name, start, session and number in it) is not added again; "
        "the store numbers what it adds. Every line is checked before anything is written.",
    )
    imported.add_argument("file", metavar="FILE", help="the exported runs (- for stdin)")
    imported.add_argument("--store", metavar="PATH|URL", help=STORE_HELP)


def _add_ab(commands: Any) -> None:
    """The ``ab`` subcommand: the same-job A/B gate (:mod:`.session.ab`)."""
    from .analysis.thresholds import DEFAULT_AB_ROUNDS, MIN_AB_ROUNDS

    ab = commands.add_parser(
        "ab",
        help="run COMMAND at a base and at the head alternately (ABBA); exit 1 when the head "
        "is slower",
        description="Run COMMAND (which records a run named NAME into $TRACEML_NB_STORE) in a "
        "temporary git worktree of --base REF (A) and in the current tree (B), alternately, "
        "ABBA, and judge the paired per-round ratios of their median step times. Exit 0: not "
        "slower; 1: slower (a regression); 2: a usage error, a command that failed or recorded "
        "no run; 3: inconclusive after --rounds rounds.",
        usage="python -m traceml_nb ab --name NAME (--base REF | --base-command CMD) "
        "[--rounds K] [--max-slowdown 0.10] [--store PATH] [--format text|markdown] "
        "[--junit FILE] -- COMMAND [ARGS...]",
    )
    ab.add_argument("--name", required=True, help="the run name COMMAND records")
    base = ab.add_mutually_exclusive_group(required=True)
    base.add_argument(
        "--base", metavar="REF", help="the git ref to compare with (e.g. origin/main)"
    )
    base.add_argument(
        "--base-command",
        metavar="CMD",
        help="run CMD (one string, split as a shell would) as the base instead of a git ref",
    )
    ab.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_AB_ROUNDS,
        metavar="K",
        help=f"at most K rounds of two runs (default {DEFAULT_AB_ROUNDS}, at least "
        f"{MIN_AB_ROUNDS}); the gate stops once decided",
    )
    ab.add_argument(
        "--max-slowdown",
        type=_fraction,
        default=None,
        metavar="FRACTION",
        help="the slowdown of the median step time to catch (default 0.10 = 10%%)",
    )
    ab.add_argument(
        "--store",
        metavar="PATH|URL",
        help="the store the runs record into, a SQLite file or postgresql://user@host:port/db "
        "(default: a temporary one, deleted at the end)",
    )
    ab.add_argument("--format", choices=("text", "markdown"), default="text")
    ab.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")
    ab.add_argument(
        "training_command", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- COMMAND [ARGS...]"
    )


def _emit(report: GateReport, args: argparse.Namespace, command: str) -> int:
    """Print a gate's ``report`` (``--format``), write its JUnit XML (``--junit``) and return
    its exit code; 2 when the XML cannot be written."""
    print(report.markdown() if args.format == "markdown" else report.text())
    if args.junit:
        try:
            report.write_junit(args.junit)
        except OSError as exc:
            print(f"traceml_nb {command}: cannot write {args.junit}: {exc}", file=sys.stderr)
            return 2
    return report.exit_code


def _ab_main(args: argparse.Namespace) -> int:
    """``python -m traceml_nb ab``: the gate's paragraph to stdout, progress to stderr."""
    import shlex

    from .analysis.thresholds import DEFAULT_MAX_SLOWDOWN
    from .session.ab import ab
    from .session.ab_tidy import Terminated
    from .views.ab_report import AbReport, progress_line

    command = list(args.training_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.base_command is not None:
        try:
            base_command: list[str] | None = shlex.split(args.base_command)
        except ValueError as exc:
            print(f"traceml_nb ab: --base-command: {exc}", file=sys.stderr)
            return 2
    else:
        base_command = None

    def progress(event: str, result: Any) -> None:
        print(progress_line(event, result), file=sys.stderr, flush=True)

    try:
        result = ab(
            args.name,
            command,
            base=args.base,
            base_command=base_command,
            rounds=args.rounds,
            max_slowdown=DEFAULT_MAX_SLOWDOWN if args.max_slowdown is None else args.max_slowdown,
            store=args.store,
            progress=progress,
        )
    except KeyboardInterrupt:
        print("traceml_nb ab: interrupted; its runs, worktree and store are gone", file=sys.stderr)
        return 130
    except Terminated as exc:
        print("traceml_nb ab: terminated; its runs, worktree and store are gone", file=sys.stderr)
        return 128 + exc.signum
    report = AbReport(result)
    return _emit(report, args, "ab")


def _check_history(args: argparse.Namespace) -> int:
    """``check --history``: the latest shift of the name's stored step time."""
    from .analysis.thresholds import DEFAULT_MAX_SLOWDOWN
    from .session.shifts import check_history
    from .views.shift_lines import HistoryCheckReport

    slowdown = DEFAULT_MAX_SLOWDOWN if args.max_slowdown is None else args.max_slowdown
    report = HistoryCheckReport(check_history(args.name, store=args.store, max_slowdown=slowdown))
    return _emit(report, args, "check")


def _transfer_main(args: argparse.Namespace) -> int:
    """``export`` to stdout, or ``import`` of FILE: exit 0, or 2 with one line saying why."""
    from .session.store import Store, StoreError, resolve_store_path
    from .session.store_transfer import export_lines, import_lines

    command = f"traceml_nb {args.command}"
    path = resolve_store_path(args.store)
    if path is None:
        print(f"{command}: storing is off (TRACEML_NB_STORE=off)", file=sys.stderr)
        return 2
    store = Store(path)
    try:
        if args.command == "export":
            for line in export_lines(store, args.name):
                print(line)
            return 0
        if args.file == "-":
            done = import_lines(store, sys.stdin)
        else:
            with open(args.file, encoding="utf-8") as lines:
                done = import_lines(store, lines)
    except (StoreError, ValueError, OSError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    print(f"{command}: {done.added} run(s) added to {store.path}, {done.already} already there")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = parser().parse_args(argv)  # a usage error exits 2, as argparse does
    if args.command == "ab":
        return _ab_main(args)
    if args.command in ("export", "import"):
        return _transfer_main(args)
    if args.command == "check" and args.history:
        return _check_history(args)
    from .analysis.thresholds import DEFAULT_MAX_SLOWDOWN
    from .session.check import check
    from .views.check_report import CheckReport

    report = CheckReport(
        check(
            args.name,
            store=args.store,
            max_slowdown=DEFAULT_MAX_SLOWDOWN if args.max_slowdown is None else args.max_slowdown,
            against=args.against,
            any_hardware=args.any_hardware,
            runs=args.runs,
            baseline_runs=args.baseline_runs,
        )
    )
    return _emit(report, args, "check")


if __name__ == "__main__":
    sys.exit(main())
