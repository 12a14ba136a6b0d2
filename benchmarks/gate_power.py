"""The CI gates' power, measured with real processes: how often ``ab`` and ``check`` cry wolf on
identical jobs and how often they catch a real slowdown.

Every job is a fresh process running ``gate_job.py``: a small conv net on 3×32×32 inputs,
batch 32, one intra-op thread, ~150 steps under ``traceml_nb.Session().run("smoke")``, its
width calibrated at the start so a step takes ~10 ms on this machine. A slower change is
ADDED COMPUTE in each step (64×64 matmuls worth +10% or +20% of the step, their count
calibrated once at the start by timing), never a sleep. The parts:

* ``ab``: ``python -m traceml_nb ab --name smoke --base-command "python gate_job.py" --
  python gate_job.py``, the same job on both sides (identical), and with the head adding +10%
  and +20%; each decision at the gate's default rounds; the exit codes, the rounds used and the
  wall time of each decision;
* ``check``: a store of ``--baseline-jobs`` jobs (default 5) of the one configuration, then
  jobs (identical, +10%, +20%), each recorded into a COPY of that store and judged there by
  ``python -m traceml_nb check --name smoke --store COPY`` (so no judged job joins the
  baseline); with ``--check-runs K``, K jobs of the case into the copy and ``check --runs K``;
* ``busy-ab`` and ``busy-check``: identical decisions and jobs again while another process
  (``python -c "while True: pass"``, started and killed here) keeps one core busy: the false
  alarms of a loaded machine.

The cases of a part are interleaved (identical, +10%, +20%, identical, …) so that the
machine's drift over the study falls on all of them alike. Everything it starts (the jobs, the
gates, the busy process) and its temporary directory (the job's stores, the gates' own
temporary files: the children's ``TMPDIR``) are gone when it ends, however it ends (Ctrl-C,
SIGTERM). Progress goes to stderr with the seconds since the start; the markdown table to
stdout.

Usage::

    .venv/bin/python benchmarks/gate_power.py                 # the full study (~40 minutes)
    .venv/bin/python benchmarks/gate_power.py --quick         # a few minutes: every line once
    .venv/bin/python benchmarks/gate_power.py --ab-decisions 30 --check-jobs 50 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NAME = "smoke"
JOB = HERE / "gate_job.py"
PARTS = ("ab", "check", "busy-ab", "busy-check")
IDENTICAL, PLUS10, PLUS20 = "identical", "+10%", "+20%"
SLOWDOWNS = {IDENTICAL: 0.0, PLUS10: 0.10, PLUS20: 0.20}
EXIT_WORDS = {1: "slower (exit 1)", 0: "not slower (exit 0)", 3: "inconclusive (exit 3)"}
#: Seconds a gate gets to clean up after SIGTERM before its process group is killed.
GATE_GRACE_S = 20.0
#: Hang guards: one job, one check, one A/B decision (30 rounds of two jobs on a busy VM).
JOB_TIMEOUT_S, CHECK_TIMEOUT_S, AB_TIMEOUT_S = 600.0, 300.0, 3 * 3600.0

_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr, with the seconds since the start."""
    print(f"[{time.perf_counter() - _T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


class Stopped(BaseException):
    """SIGTERM arrived; raised so that the cleanup runs, like KeyboardInterrupt."""


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signum)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM does not cut the cleanup short."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


# --- the processes it starts ----------------------------------------------------------------------
@dataclass
class Done:
    """A finished child: its exit code (None: killed at its hang guard), output, wall time."""

    code: int | None
    stdout: str
    stderr: str
    wall_s: float


def _killpg(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@dataclass
class Children:
    """The processes this study runs, each its own process group, stopped however it ends."""

    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> Done:
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        try:
            try:
                out, err = proc.communicate(timeout=timeout)
                code: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                out, err, code = "", f"killed after {timeout:.0f} s (hang guard)", None
        finally:
            self.stop(proc)
        return Done(code, out, err, time.monotonic() - started)

    def start(self, argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[str], grace: float = GATE_GRACE_S) -> None:
        """SIGTERM to the child's process group (a gate then removes its runs and files), then
        SIGKILL after ``grace``; the child reaped, its pipes closed."""
        if proc.poll() is None:
            _killpg(proc.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        _killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left
        with suppress(subprocess.TimeoutExpired, ValueError, OSError):
            proc.communicate(timeout=5)
        if proc.poll() is None:
            proc.wait()
        if proc in self.procs:
            self.procs.remove(proc)

    def close(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)


# --- calibration ----------------------------------------------------------------------------------
@dataclass
class Calibration:
    """The step: ``width`` chosen so a step takes ~ the target in a loop alone (``widths_ms``);
    ``step_ms`` the median step time of real jobs at that width; ``matmul_ms`` the cost in a
    job's step of one added matmul (from real jobs with and without ``probe`` of them);
    ``extra[case]`` the matmuls that add its share."""

    width: int
    widths_ms: dict[int, float]
    matmul_alone_ms: float
    probe: int
    plain_ms: list[float]
    probe_ms: list[float]
    step_ms: float
    matmul_ms: float
    extra: dict[str, int]
    torch: str

    def share(self, case: str) -> float:
        """The slowdown the added matmuls of ``case`` stand for, as calibrated."""
        return self.extra[case] * self.matmul_ms / self.step_ms


_MEDIAN_STEP = re.compile(r"median step ([\d.]+) ms")


# --- the study ------------------------------------------------------------------------------------
@dataclass
class Sizes:
    steps: int
    ab_decisions: int
    ab_identical_decisions: int  #: identical A/B decisions, quiet (the false alarms' count)
    check_jobs: int
    check_identical_jobs: int  #: identical check decisions, quiet (the false alarms' count)
    baseline_jobs: int
    busy_decisions: int
    busy_jobs: int
    ab_rounds: int | None  #: None: the gate's default
    check_runs: int = 1  #: jobs a check decision judges together (``check --runs K``)
    #: the check's ``--baseline-runs N`` (None: the gate's default)
    check_baseline_runs: int | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> Sizes:
        q = args.quick

        def pick(value: int | None, quick: int, full: int) -> int:
            return value if value is not None else (quick if q else full)

        ab_decisions = pick(args.ab_decisions, 1, 4)
        check_jobs = pick(args.check_jobs, 1, 15)
        return cls(
            steps=pick(args.steps, 30, 150),
            ab_decisions=ab_decisions,
            ab_identical_decisions=pick(args.ab_identical_decisions, ab_decisions, ab_decisions),
            check_jobs=check_jobs,
            check_identical_jobs=pick(args.check_identical_jobs, check_jobs, check_jobs),
            baseline_jobs=pick(args.baseline_jobs, 2, 5),
            busy_decisions=pick(args.busy_decisions, 1, 2),
            busy_jobs=pick(args.busy_jobs, check_jobs, check_jobs),
            ab_rounds=args.ab_rounds if args.ab_rounds is not None else (5 if q else None),
            check_runs=args.check_runs,
            check_baseline_runs=args.check_baseline_runs,
        )


_STEP_TIME = re.compile(r"step time ([\d.]+) (ms|s) → ([\d.]+) (ms|s)")
_ROUND = re.compile(r"^round (\d+)/(\d+):", re.MULTILINE)


def measured_change(text: str) -> float | None:
    """The change the gate's paragraph states ("step time 11.4 ms → 13.5 ms"), B/A less 1."""
    m = _STEP_TIME.search(text)
    if m is None:
        return None
    scale = {"ms": 1.0, "s": 1000.0}
    a, b = float(m[1]) * scale[m[2]], float(m[3]) * scale[m[4]]
    return b / a - 1 if a > 0 else None


def _paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


@dataclass
class Study:
    sizes: Sizes
    tmp: Path
    children: Children
    width: int = 0
    cal: Calibration | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    baseline: Path | None = None
    progress: Path | None = None  #: each decision appended as a JSON line as it ends

    def calibrate(self, target_ms: float, width: int | None, quick: bool) -> Calibration:
        """The width from loops alone (a child process), then the added matmuls' cost from
        real jobs, plain and with ``probe`` matmuls (about +100%), alternately."""
        env = self.env()
        env["GATE_STEPS"] = "15" if quick else "40"
        done = self.children.run(
            [sys.executable, str(JOB), "--widths", str(target_ms)], env, self.tmp, JOB_TIMEOUT_S
        )
        if done.code != 0:
            raise RuntimeError(f"calibration failed ({done.code}): {done.stderr[-2000:]}")
        found = json.loads(done.stdout)
        widths_ms = {int(w): float(ms) for w, ms in found["widths_ms"].items()}
        self.width = width or min(widths_ms, key=lambda w: abs(widths_ms[w] - target_ms))
        alone = float(found["matmul_alone_ms"])
        guess = widths_ms.get(self.width, target_ms)
        probe = max(1, math.ceil(guess / alone))  # about +100%: the jobs' noise, diluted
        store = self.tmp / "calibration.sqlite"
        plain: list[float] = []
        heavy: list[float] = []
        for _ in range(1 if quick else 3):
            for matmuls, into in ((0, plain), (probe, heavy)):
                m = _MEDIAN_STEP.search(self.job(store, matmuls).stdout)
                if m is None:
                    raise RuntimeError("calibration: a job printed no median step")
                into.append(float(m[1]))
        step_ms = statistics.median(plain)
        matmul_ms = max((statistics.median(heavy) - step_ms) / probe, alone / 4)
        extra = {case: round(share * step_ms / matmul_ms) for case, share in SLOWDOWNS.items()}
        self.cal = Calibration(
            self.width,
            widths_ms,
            alone,
            probe,
            plain,
            heavy,
            step_ms,
            matmul_ms,
            extra,
            str(found["torch"]),
        )
        return self.cal

    def env(self, extra: int = 0, store: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("TRACEML_NB_STORE", None)
        rest = env.get("PYTHONPATH", "")
        env.update(
            GATE_WIDTH=str(self.width),
            GATE_STEPS=str(self.sizes.steps),
            GATE_EXTRA=str(extra),
            GATE_NAME=NAME,
            TMPDIR=str(self.tmp / "tmp"),  # the gates' own temporary files end with ours
            XDG_DATA_HOME=str(self.tmp / "xdg"),  # never the user's store
            PYTHONPATH=str(ROOT) + (os.pathsep + rest if rest else ""),
        )
        if store is not None:
            env["TRACEML_NB_STORE"] = str(store)
        return env

    def job(self, store: Path, extra: int) -> Done:
        done = self.children.run(
            [sys.executable, str(JOB)], self.env(extra, store), self.tmp, JOB_TIMEOUT_S
        )
        if done.code != 0:
            raise RuntimeError(f"the job failed ({done.code}): {done.stderr[-2000:]}")
        return done

    def build_baseline(self) -> None:
        self.baseline = self.tmp / "baseline.sqlite"
        for i in range(self.sizes.baseline_jobs):
            done = self.job(self.baseline, 0)
            log(f"baseline job {i + 1}/{self.sizes.baseline_jobs}: {done.stdout.strip()}")

    def ab_decision(self, case: str, load: str) -> dict[str, Any]:
        assert self.cal is not None
        job = [sys.executable, str(JOB)]
        extra = self.cal.extra[case]
        head = job if extra == 0 else ["env", f"GATE_EXTRA={extra}", *job]
        argv = [sys.executable, "-m", "traceml_nb", "ab", "--name", NAME]
        argv += ["--base-command", shlex.join(job)]
        if self.sizes.ab_rounds is not None:
            argv += ["--rounds", str(self.sizes.ab_rounds)]
        done = self.children.run([*argv, "--", *head], self.env(), self.tmp, AB_TIMEOUT_S)
        rounds = [(int(a), int(b)) for a, b in _ROUND.findall(done.stderr)]
        return {
            "gate": "ab",
            "load": load,
            "case": case,
            "extra_matmuls": extra,
            "exit": done.code,
            "rounds": rounds[-1][0] if rounds else None,
            "rounds_allowed": rounds[-1][1] if rounds else self.sizes.ab_rounds,
            "wall_s": done.wall_s,
            "change": measured_change(done.stdout),
            "verdict": _paragraph(done.stdout),
            "progress": [line for line in done.stderr.splitlines() if _ROUND.match(line)],
            "stderr_tail": done.stderr.splitlines()[-8:] if done.code not in EXIT_WORDS else [],
        }

    def check_decision(self, case: str, load: str) -> dict[str, Any]:
        assert self.baseline is not None and self.cal is not None
        copy = self.tmp / "judged.sqlite"
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.baseline) + suffix)
            if src.exists():
                shutil.copyfile(src, str(copy) + suffix)
        k = self.sizes.check_runs
        try:
            extra = self.cal.extra[case]
            jobs = [self.job(copy, extra) for _ in range(k)]
            argv = [sys.executable, "-m", "traceml_nb", "check", "--name", NAME]
            argv += ["--runs", str(k)] if k > 1 else []
            n = self.sizes.check_baseline_runs
            argv += ["--baseline-runs", str(n)] if n is not None else []
            done = self.children.run(
                [*argv, "--store", str(copy)], self.env(), self.tmp, CHECK_TIMEOUT_S
            )
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(str(copy) + suffix).unlink(missing_ok=True)
        job_s = sum(job.wall_s for job in jobs)
        return {
            "gate": "check" + "".join(f" {a}" for a in argv[6:]),
            "load": load,
            "case": case,
            "extra_matmuls": extra,
            "exit": done.code,
            "job_s": job_s,
            "wall_s": job_s + done.wall_s,
            "change": measured_change(done.stdout),
            "verdict": _paragraph(done.stdout),
            "stderr_tail": done.stderr.splitlines()[-8:] if done.code not in EXIT_WORDS else [],
        }

    def part(self, gate: str, load: str, counts: dict[str, int]) -> None:
        """``counts[case]`` decisions of each case, spread evenly over the part: the i-th of n
        at (i + 1/2)/n of the way, so cases of unequal counts meet the machine's drift alike."""
        decide = self.ab_decision if gate == "ab" else self.check_decision
        order = sorted(
            ((i + 0.5) / n, k, i, case)
            for k, (case, n) in enumerate(counts.items())
            for i in range(n)
        )
        for _, _, i, case in order:
            n = counts[case]
            d = decide(case, load)
            self.decisions.append(d)
            if self.progress is not None:
                with self.progress.open("a") as f:
                    f.write(json.dumps(d, default=str) + "\n")
            rounds = f", {d['rounds']} rounds" if d.get("rounds") else ""
            change = f", {d['change']:+.1%}" if d["change"] is not None else ""
            log(
                f"{gate} {load} {case} {i + 1}/{n}: exit {d['exit']}{change}{rounds}, "
                f"{d['wall_s']:.0f} s"
            )


def run_study(study: Study, parts: list[str], busy_env: dict[str, str]) -> dict[str, Any]:
    sizes = study.sizes
    busy_pid = None
    if "ab" in parts:
        n = sizes.ab_decisions
        study.part("ab", "quiet", {IDENTICAL: sizes.ab_identical_decisions, PLUS10: n, PLUS20: n})
    if "check" in parts or "busy-check" in parts:
        study.build_baseline()
    if "check" in parts:
        n = sizes.check_jobs
        n0 = sizes.check_identical_jobs
        study.part("check", "quiet", {IDENTICAL: n0, PLUS10: n, PLUS20: n})
    if "busy-ab" in parts or "busy-check" in parts:
        busy = study.children.start([sys.executable, "-c", "while True: pass"], busy_env, study.tmp)
        busy_pid = busy.pid
        log(f"one core kept busy (pid {busy.pid})")
        try:
            if "busy-ab" in parts:
                study.part("ab", "busy", {IDENTICAL: sizes.busy_decisions})
            if "busy-check" in parts:
                study.part("check", "busy", {IDENTICAL: sizes.busy_jobs})
        finally:
            study.children.stop(busy, grace=1.0)
            log("the busy process stopped")
    return {"busy_pid": busy_pid}


# --- the table --------------------------------------------------------------------------------------
def _count(ds: list[dict[str, Any]], code: int) -> str:
    return f"{sum(d['exit'] == code for d in ds)}/{len(ds)}"


def table(decisions: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| gate | machine | change | decisions | slower (exit 1) | not slower (exit 0) | "
        "inconclusive (exit 3) | no verdict (exit 2 or killed) | measured change (median) | "
        "rounds (mean, max) | wall per decision (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for d in decisions:
        groups.setdefault((d["gate"], d["load"], d["case"]), []).append(d)
    for (gate, load, case), ds in groups.items():
        other = sum(d["exit"] not in EXIT_WORDS for d in ds)
        changes = [d["change"] for d in ds if d["change"] is not None]
        change = f"{statistics.median(changes):+.1%}" if changes else "–"
        rounds = [d["rounds"] for d in ds if d.get("rounds")]
        used = f"{statistics.fmean(rounds):.1f}, {max(rounds)}" if rounds else "–"
        wall = statistics.median(d["wall_s"] for d in ds)
        machine = "one core busy" if load == "busy" else "quiet"
        lines.append(
            f"| `{gate}` | {machine} | {case} | {len(ds)} | {_count(ds, 1)} | {_count(ds, 0)} | "
            f"{_count(ds, 3)} | {other}/{len(ds)} | {change} | {used} | {wall:.0f} s |"
        )
    return lines


def _machine(torch_version: str) -> dict[str, str]:
    model = "unknown"
    with suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "torch": torch_version,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every line once, to see it work: 1 decision of each case, 30 steps a job, 2 "
        "baseline jobs, A/B decisions of 5 rounds (a few minutes; its figures mean nothing)",
    )
    parser.add_argument(
        "--ab-decisions", type=int, help="A/B decisions of each case, quiet machine (default 4)"
    )
    parser.add_argument(
        "--ab-identical-decisions",
        type=int,
        help="identical A/B decisions, quiet machine (default: --ab-decisions)",
    )
    parser.add_argument(
        "--check-jobs", type=int, help="judged check jobs of each case, quiet (default 15)"
    )
    parser.add_argument(
        "--check-identical-jobs",
        type=int,
        help="identical check decisions, quiet machine (default: --check-jobs)",
    )
    parser.add_argument(
        "--baseline-jobs", type=int, help="jobs in the check's baseline store (default 5)"
    )
    parser.add_argument(
        "--busy-decisions",
        type=int,
        help="identical A/B decisions with one core busy (default 2)",
    )
    parser.add_argument(
        "--busy-jobs",
        type=int,
        help="identical check jobs with one core busy (default: --check-jobs)",
    )
    parser.add_argument(
        "--check-runs",
        type=int,
        default=1,
        help="jobs each check decision trains and judges together, check --runs K (default 1)",
    )
    parser.add_argument(
        "--check-baseline-runs",
        type=int,
        help="the check's --baseline-runs N: its baseline the last N jobs (default: the gate's, 5)",
    )
    parser.add_argument("--steps", type=int, help="training steps of a job (default 150)")
    parser.add_argument(
        "--ab-rounds",
        type=int,
        help="the A/B gate's --rounds (default: the gate's own default; 5 with --quick)",
    )
    parser.add_argument(
        "--target-ms", type=float, default=10.0, help="the step time to calibrate (default 10)"
    )
    parser.add_argument("--width", type=int, help="the conv net's width (default: calibrated)")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"which parts, comma-separated from {', '.join(PARTS)} (default: all)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw results as JSON here")
    parser.add_argument(
        "--progress",
        type=Path,
        help="append each decision to this file as a JSON line as it ends (a stopped study "
        "keeps what it decided)",
    )
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"--parts: unknown {', '.join(unknown) or '(none given)'}")
    sizes = Sizes.of(args)
    for what, n in sizes.__dict__.items():
        if n is not None and n < (1 if what in ("steps", "baseline_jobs", "check_runs") else 0):
            parser.error(f"--{what.replace('_', '-')} must be at least 1")

    old_term = signal.signal(signal.SIGTERM, _raise_stopped)
    # Ctrl-C raises KeyboardInterrupt even where it was started with SIGINT ignored.
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = Path(tempfile.mkdtemp(prefix="traceml-gate-power-"))
    (tmp / "tmp").mkdir()
    children = Children()
    code = 0
    try:
        log("calibrating the step ...")
        study = Study(sizes, tmp, children, progress=args.progress)
        cal = study.calibrate(args.target_ms, args.width, args.quick)
        log(
            f"width {cal.width}: step {cal.step_ms:.2f} ms in a job; one added matmul "
            f"{cal.matmul_ms * 1000:.1f} us in a step ({cal.matmul_alone_ms * 1000:.1f} us "
            f"alone); +10%: {cal.extra[PLUS10]} matmuls, +20%: {cal.extra[PLUS20]}"
        )
        extra = run_study(study, parts, study.env())
        wall = time.perf_counter() - _T0
        info = _machine(cal.torch)
        head = [
            f"CI gates' power, {time.strftime('%Y-%m-%d %H:%M')}, {wall / 60:.1f} minutes",
            f"machine: nproc {info['nproc']}, {info['cpu']}, python {info['python']}, torch "
            f"{info['torch']}",
            f"job: conv net width {cal.width}, batch 32, 3×32×32, 1 thread, {sizes.steps} "
            f"steps, step {cal.step_ms:.1f} ms (calibrated); slowdowns added as 64×64 matmuls: "
            f"+10% = {cal.extra[PLUS10]} ({cal.share(PLUS10):+.1%} as calibrated), +20% = "
            f"{cal.extra[PLUS20]} ({cal.share(PLUS20):+.1%})",
            f"check: {sizes.baseline_jobs} baseline jobs stored (--baseline-runs "
            f"{sizes.check_baseline_runs or 'the default'}), each judged job (--runs "
            f"{sizes.check_runs}: each {sizes.check_runs} jobs) against a copy; "
            f"ab: rounds {sizes.ab_rounds or 'the default'}, early stop",
            "",
        ]
        print("\n".join([*head, *table(study.decisions)]), flush=True)
        if args.json is not None:
            data = {
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "wall_s": wall,
                "machine": info,
                "sizes": sizes.__dict__,
                "parts": parts,
                "calibration": {**cal.__dict__, "shares": {c: cal.share(c) for c in SLOWDOWNS}},
                "decisions": study.decisions,
                **extra,
            }
            args.json.write_text(json.dumps(data, indent=2, default=str))
    except (KeyboardInterrupt, Stopped) as exc:
        code = 143 if isinstance(exc, Stopped) else 130
        log("interrupted: stopping its processes and removing its temporary directory")
    finally:
        with _signals_ignored():
            children.close()
            shutil.rmtree(tmp, ignore_errors=True)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
    return code


if __name__ == "__main__":
    sys.exit(main())
