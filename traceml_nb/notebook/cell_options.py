"""The ``%%traceml`` line, parsed: each option's type (a bad value is said before the cell
runs, never inside the training loop) and :class:`CellOptions`, what the magic runs with."""

from __future__ import annotations

import argparse
import keyword
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError

from ..engine.options import RunOptions
from ..engine.run import resolve_device, validate_interval


def interval_arg(text: str) -> float:
    try:
        return validate_interval(text)  # type: ignore[arg-type]  # it parses strings too
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def warmup_arg(text: str) -> str | int:
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be 'auto' or a number of steps, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def name_arg(text: str) -> str:
    name = " ".join(text.split())
    if not name:
        raise argparse.ArgumentTypeError("the run's name must not be empty")
    return name


def identifier_arg(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid Python variable name")
    return text


def log_to_arg(text: str) -> str:
    from ..session.trackers import parse_log_to

    try:  # caught here: a misspelt tracker is said before the training runs, not after
        parse_log_to(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def profile_steps_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of steps, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 step, got {value}")
    return value


def device_arg(text: str) -> str:
    try:  # caught here: a bad index would otherwise fail inside the user's training loop
        resolve_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


@dataclass(frozen=True)
class CellOptions:
    """The parsed ``%%traceml`` line."""

    name: str | None
    #: how the run is measured and concluded: ``--interval``, ``--device``, ``--profile [N]``
    #: (after ``--warmup N`` steps), ``--profile-dir``, ``--warmup``, ``--no-compare``,
    #: ``--store``/``--no-store``, ``--log-to``, ``--log-steps``
    run: RunOptions
    view: str
    out: str | None
    #: tune the DataLoader right after an input-bound run (``--tune``)
    tune: bool = False


def parse_options(magic: Callable[..., Any], line: str) -> CellOptions:
    """Parse ``line`` with ``magic``'s parser; any problem is a UsageError showing the usage."""
    parser = magic.parser  # type: ignore[attr-defined]
    try:  # as a shell splits it: --name "4 workers, pinned" is one name, without its quotes
        args = parser.parse_args(shlex.split(line))
    except (UsageError, ValueError) as exc:
        usage = " ".join(parser.format_usage().replace("::", "").split())
        raise UsageError(f"usage: {usage}\n%%traceml: {exc}") from None
    run = RunOptions(
        interval=args.interval,
        device=args.device,
        profile=args.profile,
        profile_after=args.warmup if isinstance(args.warmup, int) else None,
        profile_dir=args.profile_dir,
        warmup=args.warmup,
        compare=not args.no_compare,
        store=False if args.no_store else args.store,
        log_to=args.log_to,
        log_steps=args.log_steps or None,  # None: the session's
    )
    return CellOptions(name=args.name, run=run, view=args.view, out=args.out, tune=args.tune)
