"""The same-job A/B gate, ``python -m traceml_nb ab``: in a subprocess on a real git repository
made here (a tiny torch training loop on CPU, recorded under ``traceml_nb.Session().run``), its
exit codes, its cleanup after Ctrl-C and SIGTERM, and its text, markdown and JUnit views.

Each run of the training script is a fresh Python process importing torch (2-7 s on a busy
2-core machine; it makes no ``torch.optim`` optimizer, whose first construction imports torch's
compiler, another 1-2 s), so the gates here use few rounds and ~60 steps of ~6 ms. The slowdown
of the regression case is added compute (matrix products, ~2.5x the step), which a loaded
machine only makes larger; nothing here times anything against the clock.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from traceml_nb.analysis.paired import judge_rounds
from traceml_nb.session.ab import (
    ERROR,
    INCONCLUSIVE,
    NOT_SLOWER,
    REGRESSION,
    AbResult,
    AbRound,
    AbRun,
)
from traceml_nb.views.ab_report import AbReport, progress_line

TRAIN = '''\
"""A tiny training smoke test: {steps} steps of a small model, recorded as run {name!r}."""
import sys
import time

import torch

import traceml_nb

EXTRA = {extra}  # matrix products added to each step
if len(sys.argv) > 1:
    EXTRA = int(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
batches = torch.utils.data.TensorDataset(
    torch.randn({steps} * 32, 64), torch.randint(0, 4, ({steps} * 32,))
)
a, b = torch.randn(200, 200), torch.randn(200, 200)
with traceml_nb.Session().run({name!r}) as run:
    for x, y in torch.utils.data.DataLoader(batches, batch_size=32):
        time.sleep(0.004)  # stands for the GPU's share of a step
        for _ in range(EXTRA):
            torch.mm(a, b)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():  # SGD by hand: torch.optim's first optimizer costs a process 1-2 s
            for p in model.parameters():
                p -= 0.01 * p.grad
print("median step", run.result().summary.step_ms_median)
'''
#: Matrix products that make the step ~2.5x as long (a 200x200 product: ~0.2-0.3 ms here).
SLOW_EXTRA = 40
STEPS = 60


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=ab test", "-c", "user.email=ab@test", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def make_repo(path: Path, *, head_extra: int | None, head_note: str = "") -> Path:
    """A git repository whose ``main`` has train.py at EXTRA = 0 and whose checked-out branch
    ``change`` has one more commit: EXTRA = ``head_extra`` (None: only a comment changed)."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    script = path / "train.py"
    script.write_text(TRAIN.format(extra=0, steps=STEPS, name="smoke"))
    git(path, "add", "train.py")
    git(path, "commit", "-q", "-m", "base")
    git(path, "checkout", "-q", "-b", "change")
    text = TRAIN.format(extra=head_extra or 0, steps=STEPS, name="smoke")
    script.write_text(text + (head_note or "# an unchanged loop, a changed comment\n"))
    git(path, "commit", "-q", "-am", "change")
    return path


def ab(
    repo: Path, *args: str, tmp: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m traceml_nb ab ARGS`` in ``repo`` (TMPDIR = ``tmp`` when given)."""
    env = dict(os.environ)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return subprocess.run(
        [sys.executable, "-m", "traceml_nb", "ab", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def train_command() -> list[str]:
    return ["--", sys.executable, "train.py"]


def assert_clean(repo: Path, tmp: Path) -> None:
    """Only the main worktree is left, and the gate's temporary directory is gone (torch's
    own caches, made by the training runs, may stay)."""
    worktrees = git(repo, "worktree", "list", "--porcelain").count("worktree ")
    assert worktrees == 1, git(repo, "worktree", "list")
    assert gate_dirs(tmp) == []


def gate_dirs(tmp: Path) -> list[str]:
    return [p.name for p in tmp.iterdir() if p.name.startswith("traceml-ab-")]


@pytest.fixture
def tmp(tmp_path):
    """A TMPDIR for the gate, to see that it leaves nothing there."""
    path = tmp_path / "tmp"
    path.mkdir()
    return path


# --- real runs --------------------------------------------------------------------------------
def test_a_commit_that_adds_compute_to_each_step_exits_1(tmp_path, tmp):
    repo = make_repo(tmp_path / "repo", head_extra=SLOW_EXTRA)
    junit = tmp_path / "ab.xml"
    done = ab(
        repo,
        "--name", "smoke", "--base", "main", "--rounds", "7",
        "--format", "markdown", "--junit", str(junit),
        *train_command(),
        tmp=tmp,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith("### \u274c traceml_nb ab: `smoke` \u2014 regression"), out
    assert "REGRESSION: 'smoke' is slower at HEAD than at main: step time " in out
    assert "rounds (" in out and "runs, ABBA), paired per round" in out
    assert "| round | order | A: main (" in out
    assert "| 1 | A B |" in out and "| 2 | B A |" in out
    progress = done.stderr.splitlines()
    assert progress[0].startswith("traceml_nb ab 'smoke': A = main (")
    assert progress[1].startswith("round 1/7: A ") and ", B " in progress[1]
    assert "slower" in progress[-1]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("errors") == "0"
    case = suite.find("testcase")
    assert case is not None and case.get("name") == "smoke"
    failure = case.find("failure")
    assert failure is not None and "REGRESSION" in (failure.get("message") or "")
    assert_clean(repo, tmp)


def test_two_identical_commits_are_never_called_slower(tmp_path, tmp):
    """Exit 0 (not slower) on a steady machine; on a loaded one the noise of ~6 ms steps in a
    handful of rounds may leave it inconclusive (exit 3), so that is allowed too: what must
    never happen is exit 1 (the whole procedure's false alarm rate, measured in
    tests/unit/test_paired.py, is 0.25%)."""
    repo = make_repo(tmp_path / "repo", head_extra=None)
    done = ab(repo, "--name", "smoke", "--base", "main", "--rounds", "6", *train_command(), tmp=tmp)
    assert done.returncode in (0, 3), done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    if done.returncode == 0:
        assert first.startswith("OK: 'smoke' is not slower at HEAD than at main: step time ")
        assert "a slowdown of 10% is ruled out" in first
    else:
        assert first.startswith("INCONCLUSIVE: 'smoke' at HEAD against main after 6 rounds")
    assert_clean(repo, tmp)


def test_a_base_command_instead_of_a_ref_with_runs_kept_on_a_server(
    tmp_path, tmp, postgres_cluster
):
    """The base is the same script told to add compute; the head, without it, is faster: a gate
    asks "is it slower?" only, so that is exit 0. With ``--store`` a PostgreSQL URL, every run
    of both sides lands on the server (the team's store), and nothing of the gate stays."""
    from traceml_nb.session.store import Store

    url = postgres_cluster.url(postgres_cluster.new_database())
    repo = make_repo(tmp_path / "repo", head_extra=None)
    base = f"{shlex.quote(sys.executable)} train.py {SLOW_EXTRA}"
    done = ab(
        repo,
        "--name",
        "smoke",
        "--base-command",
        base,
        "--rounds",
        "5",
        "--store",
        url,
        *train_command(),
        tmp=tmp,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("OK: 'smoke' is not slower at HEAD than with the base command")
    assert "(\u2212" in first  # a negative change: the head is faster
    assert "the base command" in done.stderr.splitlines()[0]
    rounds = int(re.search(r"(\d+) rounds?", done.stdout).group(1))
    assert Store(url).count("smoke") == 2 * rounds
    assert_clean(repo, tmp)


# --- no verdict: exit 2 ---------------------------------------------------------------------
@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", head_extra=None)


def test_not_a_git_repository(tmp_path, tmp):
    plain = tmp_path / "plain"
    plain.mkdir()
    done = ab(plain, "--name", "smoke", "--base", "main", *train_command(), tmp=tmp)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not in a git repository" in done.stdout
    assert gate_dirs(tmp) == []


def test_an_unknown_ref(repo, tmp):
    done = ab(repo, "--name", "smoke", "--base", "no-such-ref", *train_command(), tmp=tmp)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--base no-such-ref: not a commit in the git repository" in done.stdout
    assert_clean(repo, tmp)


@pytest.mark.parametrize("tail", [[], ["--"]])
def test_no_command(repo, tmp, tail):
    done = ab(repo, "--name", "smoke", "--base", "main", *tail, tmp=tmp)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no COMMAND: give the training command after `--`" in done.stdout
    assert_clean(repo, tmp)


def test_usage_errors_of_argparse_and_of_the_rounds(repo, tmp):
    both = ab(repo, "--name", "s", "--base", "main", "--base-command", "x", "--", "y", tmp=tmp)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    neither = ab(repo, "--name", "s", "--", "y", tmp=tmp)
    assert neither.returncode == 2 and "one of the arguments" in neither.stderr
    few = ab(repo, "--name", "s", "--base", "main", "--rounds", "2", "--", "y", tmp=tmp)
    assert few.returncode == 2 and "--rounds must be at least 5" in few.stdout
    assert_clean(repo, tmp)


def test_a_command_that_fails(repo, tmp, tmp_path):
    junit = tmp_path / "ab.xml"
    code = "import sys; print('something broke'); sys.exit(3)"
    done = ab(
        repo, "--name", "smoke", "--base", "main", "--junit", str(junit),
        "--", sys.executable, "-c", code,
        tmp=tmp,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith(
        "ERROR: no verdict on 'smoke' (HEAD against main): the base (A) command exited with "
        "code 3 in round 1."
    )
    assert "Its output ended with:\n    something broke" in done.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"
    assert_clean(repo, tmp)


def test_a_command_that_records_no_run(repo, tmp):
    done = ab(
        repo, "--name", "smoke", "--base", "main",
        "--", sys.executable, "-c", "print('trained, but not measured')",
        tmp=tmp,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the base (A) command recorded no run named 'smoke' in round 1" in done.stdout
    assert "trained, but not measured" in done.stdout
    assert_clean(repo, tmp)


# --- cleanup, however it ends ---------------------------------------------------------------
HANG = (
    "import subprocess, time; subprocess.Popen(['sleep', '300']); "
    "print('training', flush=True); time.sleep(300)"
)


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)]
)
def test_an_interrupted_gate_leaves_no_worktree_directory_or_process(repo, tmp, sig, code):
    env = {**os.environ, "TMPDIR": str(tmp)}
    # a suite started in the background of a non-interactive shell inherits SIGINT ignored, and
    # Python then keeps it ignored: the gate gets Ctrl-C as a terminal would give it
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_nb", "ab", "--name", "smoke", "--base", "main",
         "--", sys.executable, "-c", HANG],
        cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True)
    reader.start()
    gate = psutil.Process(proc.pid)
    seen: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    try:
        # the first round is running: the header line is out and the base's command has
        # started its own child (the `sleep` below it)
        while time.monotonic() < deadline and proc.poll() is None:
            seen = gate.children(recursive=True)
            if any(p.name() == "sleep" for p in seen if p.is_running()) and lines:
                break
            time.sleep(0.1)
        assert proc.poll() is None, "".join(lines)
        assert lines and lines[0].startswith("traceml_nb ab 'smoke': A = main (")
        worktrees = git(repo, "worktree", "list", "--porcelain").count("worktree ")
        assert worktrees == 2 and len(gate_dirs(tmp)) == 1  # the gate's own, while it runs
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.returncode == code, "".join(lines)
    assert "its runs, worktree and store are gone" in lines[-1]
    for child in seen:
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, child
    assert_clean(repo, tmp)


# --- the views, on hand-built results -------------------------------------------------------
def _result(changes: list[float], status: str, **kw) -> AbResult:
    import math

    rounds = []
    for i, change in enumerate(changes, start=1):
        order = ("A", "B") if i % 2 else ("B", "A")
        a = AbRun("A", i, 2 * i - 1, 10.0, 58, 3.0)
        b = AbRun("B", i, 2 * i, 10.0 * (1 + change), 58, 3.0)
        rounds.append(AbRound(i, order, a, b))
    judgement = judge_rounds([math.log1p(c) for c in changes], 0.10) if len(changes) > 1 else None
    result = AbResult(
        name="smoke",
        command=["python", "train.py"],
        max_slowdown=0.10,
        rounds_allowed=kw.pop("rounds_allowed", 6),
        base_label="main",
        base_commit="0123456789abcdef",
        head_commit="fedcba9876543210",
        status=status,
        rounds=rounds,
        judgement=judgement,
        **kw,
    )
    return result


def test_the_text_of_a_regression_and_its_table():
    r = _result([0.21, 0.19, 0.22, 0.20, 0.18, 0.21], REGRESSION, exit_code=1)
    text = AbReport(r).text()
    head, table = text.split("\n\n")
    assert head.startswith(
        "REGRESSION: 'smoke' is slower at HEAD than at main: step time 10 ms \u2192 12 ms (+20%; "
        "at least +"
    )
    assert head.endswith(
        "with 99.9% confidence, and more than half the 10% allowed), 6 rounds (12 runs, ABBA), "
        "paired per round: the machine's drift cancels."
    )
    rows = table.splitlines()
    assert rows[0].split() == ["round", "order", "A:", "main", "(01234567)", "B:", "HEAD",
                               "(fedcba98)", "B/A"]  # fmt: skip
    assert rows[1].split() == ["1", "A", "B", "10", "ms", "@1", "12.1", "ms", "@2", "+21%"]
    assert rows[2].split()[:3] == ["2", "B", "A"]


def test_a_head_with_a_larger_batch_is_judged_per_sample():
    """The head doubles the batch (8 → 16) and takes 18 ms a step where the base took 10: 10%
    less time a sample, not slower; the same runs without batch sizes are 80% slower a step."""
    rounds = []
    for i, head_ms in enumerate((18.0, 18.1, 17.9, 18.05), start=1):
        a = AbRun("A", i, 2 * i - 1, 10.0, 58, 3.0, batch_size=8.0)
        b = AbRun("B", i, 2 * i, head_ms, 58, 3.0, batch_size=16.0)
        rounds.append(AbRound(i, ("A", "B") if i % 2 else ("B", "A"), a, b))
    assert all(rd.per_sample for rd in rounds) and rounds[0].change == pytest.approx(-0.1)
    r = AbResult(
        name="smoke", command=["python", "train.py"], max_slowdown=0.10, rounds_allowed=6,
        base_label="main", status=NOT_SLOWER, exit_code=0, rounds=rounds,
        judgement=judge_rounds([rd.log_ratio for rd in rounds], 0.10),
    )  # fmt: skip
    assert r.batch_sizes == (pytest.approx(8.0), pytest.approx(16.0))
    head, table = AbReport(r).text().split("\n\n")
    assert head.startswith(
        "OK: 'smoke' is not slower in the current tree than at main: time per sample 1.25 ms "
        "\u2192 1.13 ms "
        "(\u221210%; at most"
    )
    assert head.endswith(
        "The batch size went 8 \u2192 16, so the steps are compared per sample (step time 10 ms "
        "\u2192 18 ms, +80%)."
    )
    assert table.splitlines()[0].split()[-3:] == ["B/A", "per", "sample"]
    assert progress_line("round", r).startswith(
        "round 4/6: A 10 ms, B 18.1 ms (B/A \u221210% per sample;"
    )
    unknown = AbRun("B", 1, 2, 18.0, 58, 3.0)  # a batch size not known: the step time
    plain = AbRound(1, ("A", "B"), rounds[0].a, unknown)
    assert not plain.per_sample and plain.change == pytest.approx(0.8)
    # BATCH_SIZE_CHANGE_SHARE (10%) on both sides: 100 → 109 judged per step, → 110 per sample
    base = AbRun("A", 1, 1, 10.0, 58, 3.0, batch_size=100.0)
    for size, per_sample in ((109.0, False), (110.0, True)):
        head = AbRun("B", 1, 2, 11.0, 58, 3.0, batch_size=size)
        assert AbRound(1, ("A", "B"), base, head).per_sample is per_sample


def test_not_slower_inconclusive_and_error_paragraphs():
    ok = _result([0.01, -0.01, 0.0, 0.02, -0.02, 0.01], NOT_SLOWER, exit_code=0)
    text = AbReport(ok).text()
    assert text.startswith(
        "OK: 'smoke' is not slower at HEAD than at main: step time 10 ms \u2192 10 ms (\u00b10%; "
        "at most +"
    )
    assert "with 97% confidence: a slowdown of 10% is ruled out)" in text
    unsure = _result([0.3, -0.1, 0.2, -0.05, 0.25], INCONCLUSIVE, exit_code=3, rounds_allowed=5)
    assert unsure.judgement is not None and unsure.judgement.more_needed
    text = AbReport(unsure).text()
    assert text.startswith("INCONCLUSIVE: 'smoke' at HEAD against main after 5 rounds (10 runs")
    assert f"about {unsure.judgement.more_needed} more rounds would decide (--rounds " in text
    failed = _result([], ERROR, error="the head (B) command exited with code 1 in round 1")
    failed.output_tail = ["Traceback (most recent call last):", "ValueError: boom"]
    text = AbReport(failed).text()
    assert text == (
        "ERROR: no verdict on 'smoke' (HEAD against main): the head (B) command exited with "
        "code 1 in round 1.\n\nIts output ended with:\n    Traceback (most recent call last):\n"
        "    ValueError: boom"
    )


def test_markdown_junit_and_progress_lines(tmp_path):
    unsure = _result([0.3, -0.1, 0.2, -0.05, 0.25], INCONCLUSIVE, exit_code=3, rounds_allowed=5)
    report = AbReport(unsure)
    md = report.markdown()
    assert md.startswith("### \u2754 traceml_nb ab: `smoke` \u2014 inconclusive\n\nINCONCLUSIVE")
    assert "| round | order | A: main (01234567) | B: HEAD (fedcba98) | B/A |" in md
    assert "Decision: a paired t over the rounds' ln(B/A)" in md
    path = report.write_junit(tmp_path / "ab.xml")
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None and suite.get("skipped") == "1" and suite.get("failures") == "0"
    ok = AbReport(_result([0.0] * 6, NOT_SLOWER, exit_code=0))
    assert ok.markdown().startswith("### \u2705 traceml_nb ab")
    assert "<failure" not in ok.junit() and "<skipped" not in ok.junit()
    assert progress_line("start", unsure) == (
        "traceml_nb ab 'smoke': A = main (01234567) in a temporary git worktree, B = HEAD; up to "
        "5 rounds, ABBA, stopping once decided (from 5 rounds on)"
    )
    assert progress_line("round", unsure).startswith(
        "round 5/5: A 10 ms, B 12.5 ms (B/A +25%; 6 s); 5 rounds: +"
    )
    assert progress_line("round", unsure).endswith(", inconclusive")
