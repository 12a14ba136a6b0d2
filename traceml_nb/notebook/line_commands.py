"""The ``%traceml`` line commands: history, compare, baseline, save, load, export, import,
clear, tune.

Each command is a function of the kernel's :class:`~traceml_nb.session.Session` (and, for
``tune``, the shell, whose namespace holds the user's DataLoader). IPython is imported when a
command runs; a bad command line is a ``UsageError`` with the help.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from IPython.core.error import UsageError

from ..session import Session

if TYPE_CHECKING:
    from ..session.store import Store
    from ..tune.predict import TuneResult

_Number = TypeVar("_Number", int, float)

LINE_HELP = """\
%traceml: the runs measured in this kernel session.

  %traceml history          table of the runs (name, status, verdict, step time...)
  %traceml history --all    the stored runs of every session (the latest 100)
  %traceml history --name NAME   the stored runs named NAME, shifts of the step time marked
  %traceml compare A B      compare run A (before) with run B (after); A and B as listed
                            by %traceml history (number or name), or stored runs (@17)
  %traceml baseline NAME    the baseline of NAME; ... set @3,@4,@5 pins it, ... clear unpins
  %traceml save PATH        write the history to a JSON file
  %traceml load PATH        replace the history with the runs saved in PATH (and store them)
  %traceml export PATH [--name NAME]   write the stored runs (of NAME) as JSON lines
  %traceml import PATH      add the runs of an exported file to the store, each run once
  %traceml clear            forget every run of this session (the store keeps them)
  %traceml tune [RUN]       measure DataLoader settings for the training loader of the
                            last run (or RUN) and recommend the fastest cheap one; options
                            --budget SEC, --workers 0,2,4, --prefetch 2,4, --batches N,
                            --loader VAR, -o VAR (see %traceml tune --help)
  %traceml help             this text

Measure a cell with %%traceml on its first line; see %%traceml? for its options.
"""


def _cmd_help(session: Session) -> None:
    print(LINE_HELP)


def _cmd_history(session: Session, *args: str) -> None:
    from IPython.display import display

    from ..views.report import HistoryTable

    if not args:
        display(HistoryTable.of(session.history))
        return
    if args == ("--all",):
        name = None
    elif len(args) == 2 and args[0] == "--name":
        name = args[1]
    else:
        raise UsageError(f"%traceml history: expected --all or --name NAME\n\n{LINE_HELP}")
    from ..session.store import StoreError
    from ..views.history_table import StoredHistory

    store = session.store()
    if store is None:
        raise UsageError("%traceml history: storing is off (TRACEML_NB_STORE=off)")
    try:
        display(StoredHistory.of(store, name=name))
    except StoreError as exc:
        raise UsageError(f"%traceml history: {exc}") from None


def _cmd_compare(session: Session, ref_a: str, ref_b: str) -> None:
    from IPython.display import display

    from ..views.report import ComparisonView

    try:
        before, after, note = session.compare_refs(ref_a, ref_b)
    except KeyError as exc:
        raise UsageError(f"%traceml compare: {exc.args[0]}") from None
    if note:
        print(f"traceml: {note}")
    comparison = session.judge_pair(before, after)  # what changed too
    display(ComparisonView(before.label, after.label, comparison))


def _cmd_baseline(session: Session, name: str, *args: str) -> None:
    from ..session.store import StoreError

    store = session.store()
    if store is None:
        raise UsageError("%traceml baseline: storing is off (TRACEML_NB_STORE=off)")
    try:
        if not args:
            pinned = store.pins(name) if _exists(store) else []
            if pinned:
                runs = ", ".join(f"@{i}" for i in pinned)
                print(f"traceml: the baseline of {name!r} is pinned to {runs}")
            else:
                print(
                    f"traceml: the baseline of {name!r} is its last runs on the same hardware "
                    "(none pinned)"
                )
        elif args == ("clear",):
            count = store.unpin(name) if _exists(store) else 0
            print(f"traceml: unpinned the baseline of {name!r} ({count} run(s))")
        elif len(args) == 2 and args[0] == "set":
            ids = [w.strip().lstrip("@") for w in args[1].split(",") if w.strip()]
            if not ids or not all(i.isdigit() for i in ids):
                raise UsageError(
                    f"%traceml baseline: RUNS must be stored run ids like @3,@4, got {args[1]!r}"
                )
            store.pin(name, [int(i) for i in ids])
            print(f"traceml: the baseline of {name!r} is now {', '.join('@' + i for i in ids)}")
        else:
            raise UsageError(f"%traceml baseline: expected NAME [set RUNS|clear]\n\n{LINE_HELP}")
    except StoreError as exc:
        raise UsageError(f"%traceml baseline: {exc}") from None


def _exists(store: Store) -> bool:
    return bool(store.exists())


def _cmd_save(session: Session, path: str) -> None:
    try:
        session.save(path)
    except OSError as exc:
        raise UsageError(f"%traceml save: cannot write {path!r}: {exc}") from None
    print(f"traceml: saved {len(session.history)} run(s) to {path}")


def _cmd_load(session: Session, path: str) -> None:
    from ..session.history_file import HistoryFileError

    try:
        loaded = session.load(path)
    except HistoryFileError as exc:
        raise UsageError(f"%traceml load: {exc} (the history is unchanged)") from None
    print(f"traceml: loaded {loaded} run(s) from {path}")
    stored, why = session.import_to_store()
    if why:
        print(f"traceml: the loaded runs were not stored: {why}")
    elif stored:
        print(f"traceml: stored {stored} of them in the run store")


def _cmd_export(session: Session, path: str, *args: str) -> None:
    from ..session.store import StoreError
    from ..session.store_transfer import export_to_file

    if args and (len(args) != 2 or args[0] != "--name"):
        raise UsageError(f"%traceml export: expected PATH [--name NAME]\n\n{LINE_HELP}")
    store = session.store()
    if store is None:
        raise UsageError("%traceml export: storing is off (TRACEML_NB_STORE=off)")
    try:
        count = export_to_file(store, path, args[1] if args else None)
    except StoreError as exc:
        raise UsageError(f"%traceml export: {exc}") from None
    except OSError as exc:
        raise UsageError(f"%traceml export: cannot write {path!r}: {exc}") from None
    print(f"traceml: exported {count} stored run(s) to {path}")


def _cmd_import(session: Session, path: str) -> None:
    from ..session.store import StoreError
    from ..session.store_transfer import import_lines

    store = session.store()
    if store is None:
        raise UsageError("%traceml import: storing is off (TRACEML_NB_STORE=off)")
    try:
        with open(path, encoding="utf-8") as lines:
            done = import_lines(store, lines)
    except (OSError, ValueError, StoreError) as exc:
        raise UsageError(f"%traceml import: {exc} (the store is unchanged)") from None
    print(f"traceml: imported {done.added} run(s) into the store, {done.already} already there")


def _cmd_clear(session: Session) -> None:
    print(f"traceml: cleared {session.clear()} run(s) from the history")


# --- %traceml tune ----------------------------------------------------------------------------
class _TuneParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # never exit the kernel
        raise UsageError(f"{self.format_usage().strip()}\n%traceml tune: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _HelpShown(message or "")


class _HelpShown(Exception):
    pass


def _int_list(text: str) -> list[int]:
    try:
        values = [int(w) for w in text.replace(" ", "").split(",") if w]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 0,2,4, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected numbers ≥ 0 like 0,2,4, got {text!r}")
    return values


def _positive_list(text: str) -> list[int]:
    values = _int_list(text)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"prefetch factors must be ≥ 1, got {text!r}")
    return values


def _positive(kind: Callable[[str], _Number]) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


def tune_parser() -> argparse.ArgumentParser:
    from ..tune.constants import TUNE_BUDGET_S

    parser = _TuneParser(
        prog="%traceml tune",
        description="Measure DataLoader settings over the training loader's dataset (the "
        "model is not run) and recommend the cheapest within 5%% of the fastest predicted "
        "step time.",
    )
    parser.add_argument("run", nargs="?", default=None, help="run number or name (default: last)")
    parser.add_argument(
        "--budget",
        type=_positive(float),
        default=TUNE_BUDGET_S,
        metavar="SEC",
        help=f"time budget in seconds (default {TUNE_BUDGET_S:.0f})",
    )
    parser.add_argument(
        "--workers",
        type=_int_list,
        default=None,
        metavar="LIST",
        help="num_workers values to try, e.g. 0,2,4 (default: 0 up to the CPUs)",
    )
    parser.add_argument(
        "--prefetch",
        type=_positive_list,
        default=None,
        metavar="LIST",
        help="prefetch_factor values to try (default 2,4,8)",
    )
    parser.add_argument(
        "--batches",
        type=_positive(int),
        default=None,
        metavar="N",
        help="read at most N batches per candidate and round (datasets with side effects)",
    )
    parser.add_argument(
        "--loader",
        default=None,
        metavar="VAR",
        help="the DataLoader to tune, a variable of the notebook (default: the run's)",
    )
    parser.add_argument(
        "-o", "--out", default=None, metavar="VAR", help="store the TuneResult in VAR"
    )
    return parser


@dataclass
class _Context:
    session: Session
    shell: Any


def run_tuning(
    shell: Any, session: Session, ref: int | str | None = None, **options: Any
) -> TuneResult:
    """Tune run ``ref``'s DataLoader with a live table under the cell; returns the result.
    ``options``: ``loader`` (a variable name), ``out`` (a variable name), and the tuner's."""
    from ..engine.run import active_run
    from ..views.frontend import detect_frontend
    from ..views.tune import TuneLiveView

    if active_run() is not None:
        raise UsageError("%traceml tune: a run is being measured; tune after it has ended")
    namespace = shell.user_ns if shell is not None else {}
    loader_var = options.pop("loader", None)
    out = options.pop("out", None)
    loader = None
    if loader_var is not None:
        if loader_var not in namespace:
            raise UsageError(f"%traceml tune: no variable {loader_var!r} in the notebook")
        loader = namespace[loader_var]
        from torch.utils.data import DataLoader

        if not isinstance(loader, DataLoader):
            raise UsageError(
                f"%traceml tune: {loader_var!r} is a {type(loader).__name__}, not a DataLoader"
            )
    view = TuneLiveView(rich=detect_frontend(shell).rich)
    try:
        result = session.tune(
            ref, loader=loader, namespace=namespace, progress=view.update, **options
        )
    except (LookupError, KeyError) as exc:
        raise UsageError(f"%traceml tune: {exc.args[0] if exc.args else exc}") from None
    view.finish(result)
    if out:
        if not out.isidentifier():
            raise UsageError(f"%traceml tune: {out!r} is not a valid Python variable name")
        namespace[out] = result
    return result


def _cmd_tune(ctx: _Context, *args: str) -> None:
    try:
        opts = tune_parser().parse_args(list(args))
    except _HelpShown:
        print(tune_parser().format_help())
        return
    ref: int | str | None = opts.run
    run_tuning(
        ctx.shell,
        ctx.session,
        ref,
        loader=opts.loader,
        out=opts.out,
        budget_s=opts.budget,
        workers=opts.workers,
        prefetch=opts.prefetch,
        batches=opts.batches,
    )


# --- dispatch ---------------------------------------------------------------------------------
_LINE_COMMANDS: dict[str, Callable[..., None]] = {
    "help": _cmd_help,
    "history": _cmd_history,
    "compare": _cmd_compare,
    "baseline": _cmd_baseline,
    "save": _cmd_save,
    "load": _cmd_load,
    "export": _cmd_export,
    "import": _cmd_import,
    "clear": _cmd_clear,
}
#: commands given the shell too (the user's namespace); they parse their own arguments
_SHELL_COMMANDS: dict[str, Callable[..., None]] = {"tune": _cmd_tune}
_LINE_ARITY: dict[str, int | tuple[int, ...]] = {
    "help": 0,
    "history": (0, 1, 2),
    "compare": 2,
    "baseline": (1, 2, 3),
    "save": 1,
    "load": 1,
    "export": (1, 3),
    "import": 1,
    "clear": 0,
}


def dispatch(session: Session, shell: Any, line: str) -> None:
    """Run the ``%traceml`` command ``line``."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"%traceml: {exc}") from None
    command, args = (words[0], words[1:]) if words else ("help", [])
    if command in _SHELL_COMMANDS:
        _SHELL_COMMANDS[command](_Context(session, shell), *args)
        return
    handler = _LINE_COMMANDS.get(command)
    if handler is None:
        raise UsageError(f"%traceml: unknown command {command!r}\n\n{LINE_HELP}")
    _check_arity(command, args)
    handler(session, *args)


def _check_arity(command: str, args: Sequence[str]) -> None:
    arity = _LINE_ARITY[command]
    if len(args) not in (arity if isinstance(arity, tuple) else (arity,)):
        allowed = (
            " to ".join(str(n) for n in arity[:: len(arity) - 1])
            if isinstance(arity, tuple)
            else str(arity)
        )
        raise UsageError(
            f"%traceml {command}: expected {allowed} argument(s), got {len(args)}\n\n{LINE_HELP}"
        )
