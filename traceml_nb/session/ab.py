"""The same-job A/B gate: a base (A) and a head (B) run alternately, judged per round.

:func:`ab` runs a training COMMAND that records a run named NAME into the store named by
``TRACEML_NB_STORE``: the head (B) in the current tree, the base (A) in a temporary
``git worktree add --detach`` of a git ref (or a base command given as such), alternately
ABBA, one round at a time, and judges the paired per-round ratios with
:mod:`~traceml_nb.analysis.paired`. It returns an :class:`AbResult` whose ``exit_code`` is
what ``python -m traceml_nb ab`` exits with:

* **0** not slower: a slowdown of ``max_slowdown`` is ruled out;
* **1** slower: a regression, confidently slower and by at least half of ``max_slowdown``;
* **2** no verdict: a usage error, not a git repository, an unknown ref, a command that failed
  or recorded no completed run of NAME with steps;
* **3** inconclusive after the rounds allowed (``more_needed`` says how many more would decide).

Each run is a subprocess in its own process group with ``TRACEML_NB_STORE`` set to a store in a
temporary directory (or ``store``); both sides run with their tree's root first on
``PYTHONPATH`` and the working directory at the same place inside their tree. Whatever way the
gate ends (a verdict, an exception, Ctrl-C, SIGTERM) the process groups of its runs are killed,
the worktree is removed (and ``git worktree prune`` run) and the temporary directory with its
store deleted (:mod:`.ab_tidy`); an interruption then propagates (``KeyboardInterrupt``, or
:class:`~.ab_tidy.Terminated` for SIGTERM).
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..analysis.comparison import batch_sizes_differ
from ..analysis.judge import NO_CHANGE, SLOWER, Judgement
from ..analysis.paired import Look, log_ratio, look, round_order
from ..analysis.thresholds import (
    AB_OUTPUT_TAIL_LINES,
    DEFAULT_AB_ROUNDS,
    DEFAULT_MAX_SLOWDOWN,
    MIN_AB_ROUNDS,
)
from ..settings import STORE_ENV
from .ab_tidy import (
    Tidy,
    git,
    git_out,
    git_toplevel,
    one_line,
    signals_ignored,
    sigterm_raises,
    stop,
)
from .store import Store, StoreEmpty, StoreError, resolve_store_path
from .store_url import is_url

EXIT_NOT_SLOWER, EXIT_SLOWER, EXIT_NO_VERDICT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
NOT_SLOWER, REGRESSION, INCONCLUSIVE = "not slower", "regression", "inconclusive"
ERROR, RUNNING = "error", "running"
BASE, HEAD = "A", "B"


def _geometric_mean(values: list[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


@dataclass
class AbRun:
    """One run of a side: ``side`` "A" (base) or "B" (head); ``round`` 1-based; ``stored_id``
    the run's store id; ``step_ms`` its median steady step time (ms); ``steady_steps`` the steps
    that median is over; ``wall_s`` the command's wall time (s, process start to exit);
    ``batch_size`` its median batch size (None: unknown)."""

    side: str
    round: int
    stored_id: int
    step_ms: float
    steady_steps: int
    wall_s: float
    batch_size: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class AbRound:
    """A round: its base and head runs and the order they ran in (("A", "B") or ("B", "A"))."""

    index: int
    order: tuple[str, str]
    a: AbRun
    b: AbRun

    @property
    def per_sample(self) -> bool:
        """The two runs' batch sizes are known and differ by ``BATCH_SIZE_CHANGE_SHARE`` or
        more: the round compares the time per sample (a step twice as long over twice the
        samples is no slowdown)."""
        return batch_sizes_differ((self.a.batch_size, self.b.batch_size))

    @property
    def log_ratio(self) -> float:
        """ln(B / A) of the two runs' median step times, per sample where :attr:`per_sample`:
        the round's paired change."""
        if self.per_sample:
            a, b = self.a, self.b
            return log_ratio(a.step_ms / (a.batch_size or 1), b.step_ms / (b.batch_size or 1))
        return log_ratio(self.a.step_ms, self.b.step_ms)

    @property
    def change(self) -> float:
        """B / A less 1 (0.2 = the head 20% slower in this round)."""
        return math.expm1(self.log_ratio)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "order": "".join(self.order),
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "change": self.change,
        }


@dataclass
class AbResult:
    """The gate's outcome (and, while it runs, its state so far).

    ``status``: "not slower", "regression", "inconclusive", "error" (or "running");
    ``judgement`` the paired judgement of the last look (None before ``MIN_AB_ROUNDS`` rounds);
    ``base_label``: the ref as given, or None for ``base_command``; ``base_commit``/
    ``head_commit`` full hashes where known; ``error``: why there is no verdict (exit 2), one
    line, with ``output_tail`` the last lines of the failing command's output;
    ``store_path`` the store the runs went to (None: a temporary one, now deleted);
    ``wall_s`` the gate's wall time (s)."""

    name: str
    command: list[str]
    max_slowdown: float
    rounds_allowed: int
    base_label: str | None = None
    base_command: list[str] | None = None
    base_commit: str | None = None
    head_commit: str | None = None
    head_dirty: bool = False
    store_path: str | None = None
    exit_code: int = EXIT_NO_VERDICT
    status: str = RUNNING
    rounds: list[AbRound] = field(default_factory=list)
    judgement: Judgement | None = None
    error: str | None = None
    output_tail: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def runs(self) -> int:
        return 2 * len(self.rounds)

    def _geometric_mean(self, side: str) -> float | None:
        if not self.rounds:
            return None
        return _geometric_mean([(r.a if side == BASE else r.b).step_ms for r in self.rounds])

    @property
    def a_ms(self) -> float | None:
        """The base's step time (ms): the geometric mean of its runs' medians (so that
        ``b_ms / a_ms`` is exactly the paired estimate, exp(mean ln(B/A)), but where
        :attr:`batch_sizes` is set)."""
        return self._geometric_mean(BASE)

    @property
    def batch_sizes(self) -> tuple[float, float] | None:
        """Each side's batch size (the geometric mean of its runs') where every round compared
        the time per sample (:attr:`AbRound.per_sample`), else None: the paired estimate is
        then ``(b_ms / b) / (a_ms / a)``."""
        if not self.rounds or not all(r.per_sample for r in self.rounds):
            return None
        return (
            _geometric_mean([r.a.batch_size or 1.0 for r in self.rounds]),
            _geometric_mean([r.b.batch_size or 1.0 for r in self.rounds]),
        )

    @property
    def b_ms(self) -> float | None:
        """The head's step time (ms), as :attr:`a_ms`."""
        return self._geometric_mean(HEAD)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "status": self.status,
            "name": self.name,
            "command": list(self.command),
            "base": self.base_label,
            "base_command": self.base_command,
            "base_commit": self.base_commit,
            "head_commit": self.head_commit,
            "head_dirty": self.head_dirty,
            "max_slowdown": self.max_slowdown,
            "rounds_allowed": self.rounds_allowed,
            "rounds": [r.to_dict() for r in self.rounds],
            "a_ms": self.a_ms,
            "b_ms": self.b_ms,
            "judgement": self.judgement.to_dict() if self.judgement is not None else None,
            "error": self.error,
            "output_tail": list(self.output_tail),
            "store_path": self.store_path,
            "wall_s": self.wall_s,
        }


#: Called with "start" once the gate is ready to run round 1, and "round" after each round,
#: with the result so far (the CLI prints a progress line to stderr).
Progress = Callable[[str, AbResult], None]


class _NoVerdict(Exception):
    """A reason the gate has no verdict (exit 2); ``tail``: the failing command's output."""

    def __init__(self, why: str, tail: Sequence[str] = ()) -> None:
        super().__init__(why)
        self.tail = list(tail)


def ab(
    name: str,
    command: Sequence[str],
    *,
    base: str | None = None,
    base_command: Sequence[str] | None = None,
    rounds: int = DEFAULT_AB_ROUNDS,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
    store: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> AbResult:
    """Run ``command`` (the head, B) and the base (A: ``command`` in a temporary worktree of
    git ref ``base``, or ``base_command`` in ``cwd``) alternately, ABBA, up to ``rounds``
    rounds, each run recording a run named ``name`` into a temporary store (or ``store``),
    and judge the paired per-round ratios against ``max_slowdown`` (a fraction). ``cwd``: the
    current tree's working directory (default: this process's). Usage errors and failed runs
    are exit code 2 with the reason, never an exception; an interruption (Ctrl-C, SIGTERM)
    propagates once everything is cleaned up (module docstring)."""
    started = time.monotonic()
    result = AbResult(
        name=name,
        command=list(command),
        max_slowdown=max_slowdown,
        rounds_allowed=rounds,
        base_label=base,
        base_command=list(base_command) if base_command is not None else None,
    )
    tidy = Tidy()
    with sigterm_raises():
        try:
            _gate(result, tidy, os.path.abspath(os.fspath(cwd or os.getcwd())), store, progress)
        except _NoVerdict as why:
            result.exit_code, result.status = EXIT_NO_VERDICT, ERROR
            result.error, result.output_tail = str(why), why.tail
        finally:
            with signals_ignored():
                tidy.close()
            result.wall_s = time.monotonic() - started
    return result


def _check_usage(result: AbResult, store: str | os.PathLike[str] | None) -> None:
    if not result.name:
        raise _NoVerdict("--name must not be empty")
    if not result.command:
        raise _NoVerdict("no COMMAND: give the training command after `--`")
    if (result.base_label is None) == (result.base_command is None):
        raise _NoVerdict("give exactly one of --base REF and --base-command CMD")
    if result.base_command is not None and not result.base_command:
        raise _NoVerdict("--base-command is empty")
    if not (isinstance(result.rounds_allowed, int) and result.rounds_allowed >= MIN_AB_ROUNDS):
        raise _NoVerdict(
            f"--rounds must be at least {MIN_AB_ROUNDS} (the gate looks from "
            f"{MIN_AB_ROUNDS} rounds on), got {result.rounds_allowed!r}"
        )
    if not (isinstance(result.max_slowdown, (int, float)) and 0 < result.max_slowdown < 10):
        raise _NoVerdict(
            f"--max-slowdown must be a fraction such as 0.10, got {result.max_slowdown!r}"
        )
    if store is not None and not is_url(os.fspath(store)):
        folder = os.path.dirname(os.path.abspath(os.fspath(store)))
        if not os.path.isdir(folder):
            raise _NoVerdict(f"--store: the directory {folder} does not exist")


def _gate(
    result: AbResult,
    tidy: Tidy,
    cwd: str,
    store: str | os.PathLike[str] | None,
    progress: Progress | None,
) -> None:
    _check_usage(result, store)
    if not os.path.isdir(cwd):
        raise _NoVerdict(f"the working directory {cwd} does not exist")
    toplevel = git_toplevel(cwd)
    if toplevel is None and result.base_label is not None:
        raise _NoVerdict(
            f"{cwd} is not in a git repository (or git is not installed): --base "
            f"{result.base_label} needs one; --base-command CMD runs any base"
        )
    if toplevel is not None:
        result.head_commit = git_out(["rev-parse", "--verify", "--quiet", "HEAD"], toplevel)
        status = git_out(["status", "--porcelain", "--untracked-files=no"], toplevel)
        result.head_dirty = bool(status)
    tidy.tmpdir = tempfile.mkdtemp(prefix="traceml-ab-")
    path = os.path.join(tidy.tmpdir, "runs.sqlite")
    if store is not None:  # a file, or a server's URL
        path = resolve_store_path(store) or path
    result.store_path = Store(path).path if store is not None else None  # a password hidden
    head_env = _env(path, toplevel)
    head = _Side(HEAD, list(result.command), cwd, head_env)
    if result.base_command is not None:
        base = _Side(BASE, list(result.base_command), cwd, dict(head_env))
    else:
        assert toplevel is not None and result.base_label is not None
        base = _worktree_side(result, tidy, toplevel, cwd, path)
    if progress is not None:
        progress("start", result)
    sides = {BASE: base, HEAD: head}
    for index in range(1, result.rounds_allowed + 1):
        runs = {s: _run(sides[s], index, result.name, path, tidy) for s in round_order(index)}
        result.rounds.append(AbRound(index, round_order(index), runs[BASE], runs[HEAD]))
        state = look(
            [r.log_ratio for r in result.rounds], result.max_slowdown, result.rounds_allowed
        )
        _settle(result, state)
        if progress is not None:
            progress("round", result)
        if state.stop:
            return


def _settle(result: AbResult, state: Look) -> None:
    """Set the result's judgement, status and exit code from the latest look."""
    result.judgement = state.judgement
    if not state.stop:
        result.exit_code, result.status = EXIT_NO_VERDICT, RUNNING
    elif state.judgement is not None and state.judgement.verdict == SLOWER:
        result.exit_code, result.status = EXIT_SLOWER, REGRESSION
    elif state.judgement is not None and state.judgement.verdict == NO_CHANGE:
        result.exit_code, result.status = EXIT_NOT_SLOWER, NOT_SLOWER
    else:
        result.exit_code, result.status = EXIT_INCONCLUSIVE, INCONCLUSIVE


@dataclass
class _Side:
    side: str
    argv: list[str]
    cwd: str
    env: dict[str, str]


def _env(store_path: str, root: str | None) -> dict[str, str]:
    """This process's environment with the store set and ``root`` first on PYTHONPATH."""
    env = dict(os.environ)
    env[STORE_ENV] = store_path
    if root is not None:
        rest = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = root + (os.pathsep + rest if rest else "")
    return env


def _worktree_side(result: AbResult, tidy: Tidy, toplevel: str, cwd: str, path: str) -> _Side:
    """The base side: a detached worktree of the ref, the same relative working directory."""
    ref = result.base_label
    assert ref is not None
    commit = git_out(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], toplevel)
    if not commit:
        raise _NoVerdict(f"--base {ref}: not a commit in the git repository at {toplevel}")
    result.base_commit = commit
    assert tidy.tmpdir is not None
    worktree = os.path.join(tidy.tmpdir, "base")
    tidy.repo = toplevel
    done = git(["worktree", "add", "--detach", worktree, commit], toplevel)
    if done.returncode != 0:
        raise _NoVerdict(f"git worktree add of {ref} failed: {one_line(done.stderr)}")
    tidy.worktree = worktree
    rel = os.path.relpath(os.path.realpath(cwd), os.path.realpath(toplevel))
    base_cwd = os.path.normpath(os.path.join(worktree, rel))
    if not os.path.isdir(base_cwd):
        raise _NoVerdict(f"the working directory {rel} does not exist at {ref}")
    return _Side(BASE, list(result.command), base_cwd, _env(path, worktree))


def _latest_id(path: str, name: str) -> int | None:
    store = Store(path)
    if not store.exists():
        return None
    try:
        latest = store.latest(name)
    except StoreEmpty:  # a server's new database: nothing stored yet
        return None
    except StoreError as exc:
        raise _NoVerdict(f"cannot read the store: {exc}") from None
    return latest.stored_id if latest is not None else None


def _run(side: _Side, index: int, name: str, path: str, tidy: Tidy) -> AbRun:
    """One run of ``side`` in round ``index``; its new, completed run of ``name`` read back."""
    before = _latest_id(path, name)
    assert tidy.tmpdir is not None
    log_path = os.path.join(tidy.tmpdir, f"round{index}-{side.side}.log")
    what = f"the {'base (A)' if side.side == BASE else 'head (B)'} command"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                side.argv,
                cwd=side.cwd,
                env=side.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise _NoVerdict(f"cannot start {what} {side.argv[0]!r}: {exc}") from None
    tidy.procs.append(proc)
    try:
        code = proc.wait()
    finally:
        stop(proc)
        tidy.procs.remove(proc)
    wall = time.monotonic() - started
    tail = _tail(log_path)
    if code != 0:
        raise _NoVerdict(f"{what} exited with code {code} in round {index}", tail)
    try:
        store = Store(path)
        entry = store.latest(name) if store.exists() else None
    except StoreEmpty:
        entry = None
    except StoreError as exc:
        raise _NoVerdict(f"cannot read the store after {what} in round {index}: {exc}") from None
    if (
        entry is None
        or entry.stored_id is None
        or (before is not None and entry.stored_id <= before)
    ):
        raise _NoVerdict(
            f"{what} recorded no run named {name!r} in round {index} (it exited 0; it must "
            f"record one into ${STORE_ENV}: traceml_nb.Session().run({name!r}), then the "
            "run's result())",
            tail,
        )
    median = entry.summary.step_ms_median
    if entry.status != "completed" or median is None or not median > 0:
        state = entry.status if entry.status != "completed" else "completed with no steady steps"
        raise _NoVerdict(
            f"{what} recorded run @{entry.stored_id} of {name!r} in round {index}, but it is "
            f"{state}: no median step time to compare",
            tail,
        )
    steps = int(entry.summary.steady_steps or 0)
    size = entry.summary.batch_size
    return AbRun(
        side.side, index, int(entry.stored_id), float(median), steps, wall,
        float(size) if size else None,
    )  # fmt: skip


def _tail(log_path: str) -> list[str]:
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.rstrip("\n").splitlines()[-AB_OUTPUT_TAIL_LINES:]
