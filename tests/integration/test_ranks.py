"""Ranks launched from a traced cell: real torch.multiprocessing, gloo on CPU, the magic in a
real IPython shell. Two DDP ranks train on a dataset that sleeps per batch, rank 1 20 ms more
(``rank_fns``): every step of both ranks then takes at least those 20 ms (rank 0 waits for
rank 1 at the all-reduce), against a tiny model's compute of a few milliseconds, so rank 1's
data wait share stands far above rank 0's however busy the machine is."""

from __future__ import annotations

import json
import socket
from html import escape

import pytest
import rank_fns
from ipython_shell import traceml_shell

from traceml_nb.analysis.formatting import fmt_ms
from traceml_nb.analysis.stragglers import (
    RankFigures,
    find_straggler,
    slowest_rank,
    summarize_ranks,
)
from traceml_nb.analysis.thresholds import (
    STRAGGLER_MIN_WAIT_MS,
    STRAGGLER_STEP_FACTOR,
    STRAGGLER_WAIT_SHARE_MARGIN,
)
from traceml_nb.api import default_session
from traceml_nb.session.job import NOT_GATHERED
from traceml_nb.session.result import JobRank, job_line

SETUP = """
import torch.multiprocessing as mp
from rank_fns import train_rank
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def process_state_put_back():
    """What the launchers leave in this process, torch's doing and not ours (a plain
    ``mp.spawn`` or ``notebook_launcher`` leaves the same), put back after this module so that
    later tests see none of it: the spawn start method's resource tracker, a child that lives
    as long as its parent, and the SIGINT/SIGTERM handlers torch.distributed.elastic installs
    (``_terminate_process_handler``: Ctrl-C then raises its SignalException, not
    KeyboardInterrupt)."""
    import signal

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._stop()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="module")
def ip():
    with traceml_shell(SETUP) as shell:
        yield shell


@pytest.fixture(autouse=True)
def fresh_history():
    default_session().history.clear()
    yield
    default_session().history.clear()


def own_counts(out_dir) -> dict[int, int]:
    """The batches each rank counted itself."""
    return {
        int(p.stem[4:]): json.loads(p.read_text())["batches"] for p in out_dir.glob("rank*.json")
    }


def assert_rank_1_straggles(res, out_dir):
    ranks = res.ranks
    assert ranks is not None
    assert [f.rank for f in ranks.ranks] == [0, 1]
    counts = own_counts(out_dir)
    assert counts == {0: rank_fns.BATCHES, 1: rank_fns.BATCHES}
    assert {f.rank: f.steps for f in ranks.ranks} == counts
    assert ranks.straggler is not None and ranks.straggler.rank == 1
    assert ranks.straggler.by == "data wait"
    assert ranks.straggler.evidence.startswith("rank 1 waits for data ")
    assert "waiting for rank 1 at the gradient all-reduce" in ranks.straggler.evidence
    by_rank = {f.rank: f for f in ranks.ranks}
    # the 20 ms sleep is rank 1's wait, each of its steps
    assert by_rank[1].data_wait_ms_median >= 1e3 * rank_fns.EXTRA_SLEEP_S
    assert ranks.samples_per_s == pytest.approx(by_rank[0].samples_per_s + by_rank[1].samples_per_s)
    assert ranks.reported == (0, 1)
    assert res.summary.total_steps == rank_fns.BATCHES
    # the rank's phases travel with its rows (a CPU rank's host phases): the report has them
    assert res.summary.forward_ms_median is not None and res.summary.phase_shares
    assert sum(res.summary.phase_shares.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("launcher", ["spawn", "fork"])
def test_spawned_ranks_name_the_straggler(ip, capsys, tmp_path, launcher):
    call = {
        "spawn": "mp.spawn(train_rank, args=(2, {port}, {out!r}), nprocs=2)",
        "fork": (
            "mp.start_processes(train_rank, args=(2, {port}, {out!r}), nprocs=2, "
            "start_method='fork')"
        ),
    }[launcher].format(port=free_port(), out=str(tmp_path))
    result = ip.run_cell(f"%%traceml --view none -o res\nreturned = {call}\n")
    assert result.success, result.error_in_exec
    assert ip.user_ns["returned"] is None  # what start_processes returns with join=True
    res = ip.user_ns["res"]
    assert_rank_1_straggles(res, tmp_path)
    out = capsys.readouterr().out
    assert "Ranks (2):" in out
    assert "rank 1 (straggler)" in out
    assert "Straggler: rank 1 waits for data" in out
    assert "Time in collectives: unavailable (" in out
    assert res.to_dict()["ranks"]["straggler"]["rank"] == 1


def test_notebook_launcher_ranks_name_the_straggler(ip, capsys, tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, PartialState

    # a fresh notebook's state: notebook_launcher refuses to launch in a process that made an
    # Accelerator, as an earlier test's transformers Trainer does where it runs first (and the
    # ranks it forks would inherit that process's state, rank 0 of 1)
    monkeypatch.setattr(AcceleratorState, "_shared_state", {})
    monkeypatch.setattr(PartialState, "_shared_state", {})
    ip.user_ns["out_dir"] = str(tmp_path)
    source = (
        "%%traceml --view none -o res\n"
        "from accelerate import notebook_launcher\n"
        "from rank_fns import accelerate_rank\n"
        f"notebook_launcher(accelerate_rank, args=(out_dir,), num_processes=2, "
        f"use_port='{free_port()}')\n"
    )
    result = ip.run_cell(source)
    assert result.success, result.error_in_exec
    assert_rank_1_straggles(ip.user_ns["res"], tmp_path)
    assert "Straggler: rank 1 waits for data" in capsys.readouterr().out


def test_a_crashing_rank_gives_a_partial_report_and_raises_as_without_the_magic(
    ip, capsys, tmp_path
):
    from torch.multiprocessing import ProcessRaisedException

    call = f"mp.spawn(train_rank, args=(2, {free_port()}, {str(tmp_path)!r}, 0), nprocs=2)"
    result = ip.run_cell(f"%%traceml --view none -o res\n{call}\n")
    assert type(result.error_in_exec) is ProcessRaisedException
    # spawn raises the error of the rank it sees exit first: rank 0's, or rank 1's lost
    # connection where rank 1 exited first, as it does without the magic on a busy machine
    # (in 2 of 12 launches without it, with a core kept busy)
    index = result.error_in_exec.error_index
    assert index in (0, 1)
    res = ip.user_ns["res"]
    assert res.status == "failed"
    by_rank = {f.rank: f for f in res.ranks.ranks}
    assert by_rank[0].status == "failed"
    assert by_rank[0].error == "ValueError: rank 0 fails at batch 4"
    assert by_rank[0].steps >= 4  # its steps until the crash are kept
    assert by_rank[1].steps >= 1  # and the other rank's
    out = capsys.readouterr().out
    assert "Partial: rank 0 failed: ValueError: rank 0 fails at batch 4." in out
    # the cell's error, torch's multi-line one with the rank's traceback, is one line there
    raised = "ValueError: rank 0 fails at batch 4);" if index == 0 else "RuntimeError: "
    assert f"Partial report: the cell failed (ProcessRaisedException: \u2026 {raised}" in out


def test_an_fn_that_cannot_be_pickled_runs_unchanged(ip, tmp_path):
    source = (
        "%%traceml --view none -o res\n"
        "try:\n"
        "    mp.spawn(lambda i: None, nprocs=1)\n"
        "except Exception as exc:\n"
        "    err = exc\n"
    )
    result = ip.run_cell(source)
    assert result.success, result.error_in_exec
    assert "pickle" in str(ip.user_ns["err"]).lower() or "lambda" in str(ip.user_ns["err"])
    res = ip.user_ns["res"]
    assert res.ranks is None
    assert any("ranks not measured: the function" in n for n in res.capabilities.notes)


# --- the straggler rule, pure --------------------------------------------------------------
def figures(rank: int, step: float, wait: float) -> RankFigures:
    return RankFigures(
        rank,
        steps=50,
        step_ms_median=step,
        data_wait_ms_median=wait,
        data_wait_share=wait / step,
        samples_per_s=1000 / step,
    )


def test_wait_share_margin_both_sides():
    step = 100.0
    base = 5.0
    over = base + 100 * STRAGGLER_WAIT_SHARE_MARGIN + 0.5
    under = base + 100 * STRAGGLER_WAIT_SHARE_MARGIN - 0.5
    found = find_straggler([figures(0, step, base), figures(1, step, over), figures(2, step, base)])
    assert found is not None and (found.rank, found.by) == (1, "data wait")
    assert find_straggler([figures(0, step, base), figures(1, step, under)]) is None


def test_min_wait_ms_both_sides():
    step = 2.0  # a tiny step: a large share of it is still a small wait
    low = figures(1, step, STRAGGLER_MIN_WAIT_MS * 0.9)
    assert find_straggler([figures(0, step, 0.0), low]) is None
    high = figures(1, step, STRAGGLER_MIN_WAIT_MS * 1.1)
    assert find_straggler([figures(0, step, 0.0), high]).rank == 1


def test_step_factor_both_sides():
    slow = figures(1, 100 * STRAGGLER_STEP_FACTOR * 1.02, 0.0)
    found = find_straggler([figures(0, 100, 0.0), slow])
    assert found is not None and found.by == "step time"
    assert "rank 1's median step takes" in found.evidence
    assert (
        find_straggler([figures(0, 100, 0.0), figures(1, 100 * STRAGGLER_STEP_FACTOR * 0.98, 0.0)])
        is None
    )


def test_unsynchronised_straggler_evidence_says_the_others_do_not_wait():
    found = find_straggler([figures(0, 10.0, 0.5), figures(1, 40.0, 30.0)])
    assert found.by == "data wait"
    assert "they do not wait for it" in found.evidence


def test_the_slowest_rank_is_the_straggler_else_the_longest_median_with_its_tie():
    waiting = figures(1, 100.0, 60.0)
    found = slowest_rank([figures(0, 100.0, 5.0), waiting])
    assert found == (waiting, True)  # level medians: the straggler by its data wait
    a, b = figures(0, 100.0, 10.0), figures(1, 99.5, 12.0)
    assert slowest_rank([a, b]) == (a, False)  # no tie: the longest median
    assert slowest_rank([a, b], tie_share=0.01) == (b, False)  # tied: the larger data wait
    assert slowest_rank([a, figures(1, 98.5, 12.0)], tie_share=0.01) == (a, False)
    assert slowest_rank([RankFigures(0), RankFigures(1)]) is None  # no medians yet


def test_summary_sums_throughput_and_names_failures():
    a, b = figures(0, 10.0, 1.0), figures(1, 10.0, 1.0)
    b.status, b.error = "failed", "ValueError: x"
    lost = figures(2, 10.0, 1.0)
    lost.status = "lost"
    s = summarize_ranks([b, a, lost])
    assert [f.rank for f in s.ranks] == [0, 1, 2]
    assert s.samples_per_s == pytest.approx(300.0)
    assert s.straggler is None and s.reported == (0, 0)
    assert s.failures[0] == "rank 1 failed: ValueError: x"
    assert s.failures[1].startswith("rank 2 ended without its last rows")


# --- torchrun -------------------------------------------------------------------------------
def test_a_torchrun_job_lands_in_the_store_as_one_job(ip, capsys, tmp_path, run_store):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from traceml_nb.session.store import Store

    torchrun = Path(sys.executable).with_name("torchrun")
    script = Path(__file__).resolve().parents[1] / "support" / "torchrun_job.py"
    env = dict(os.environ, TRACEML_NB_STORE=str(run_store), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(counts) == [0, 1]
    assert all(c["stored_id"] is not None for c in counts.values()), counts
    rows = Store(run_store).rows()
    assert sorted((r.rank, r.world_size) for r in rows) == [(0, 2), (1, 2)]
    (job,) = {r.job_id for r in rows}
    assert job
    assert {r.rank: r.total_steps for r in rows} == {k: c["batches"] for k, c in counts.items()}
    capsys.readouterr()
    result = ip.run_cell("%traceml history --all")
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    ids = " ".join(f"@{r.id}" for r in sorted(rows, key=lambda r: r.rank))
    (line,) = [line for line in out.splitlines() if line.startswith("@")]
    assert f"{ids} torchrun-job (job, 2 ranks)" in line
    assert f"{counts[0]['batches']} / {counts[1]['batches']}" in line
    assert_rank_0_reports_the_job(counts, job, tmp_path)
    # the gate reads the job as one unit: the first job of its name has no baseline yet, and
    # its slowest rank is rank 1 (DDP ties the ranks' steps; rank 1 waits for data)
    from traceml_nb.session.check import EXIT_NO_VERDICT, check

    gate = check("torchrun-job", store=run_store)
    assert gate.exit_code == EXIT_NO_VERDICT and gate.job is not None
    assert gate.job.ids == [r.id for r in sorted(rows, key=lambda r: r.rank)]
    assert gate.job.complete and gate.candidate.rank == 1
    assert "no earlier complete job of 'torchrun-job' with 2 ranks" in gate.why


def assert_rank_0_reports_the_job(counts, job, out_dir):
    """Rank 0 gathered the job (rank 1 came ``LATE_S`` later, far inside the timeout): its
    report has the ranks table with rank 1 the straggler, rank 1's is one line; and the run
    rank 1 never asked the result of is rank 0's alone, after the gather's timeout."""
    import torchrun_job

    zero, one = counts[0], counts[1]
    assert zero["job"] == {
        "rank": 0,
        "world_size": 2,
        "job_id": job,
        "gathered": True,
        "why_not": None,
    }
    by_rank = {f["rank"]: f for f in zero["ranks"]["ranks"]}
    assert {k: f["steps"] for k, f in by_rank.items()} == {0: zero["batches"], 1: one["batches"]}
    assert {k: f["stored_id"] for k, f in by_rank.items()} == {
        0: zero["stored_id"],
        1: one["stored_id"],
    }
    assert by_rank[1]["data_wait_ms_median"] >= 1e3 * rank_fns.EXTRA_SLEEP_S
    assert zero["ranks"]["straggler"]["rank"] == 1
    assert zero["ranks"]["reported"] == [0, 0]
    text = zero["text"]
    assert "Ranks (2):" in text and "rank 1 (straggler)" in text
    assert "Straggler: rank 1 waits for data" in text and "Job throughput:" in text
    assert "the summary and the diagnosis are rank 0's own" in text
    assert f"the straggler's own run is @{one['stored_id']} in the store" in text
    assert "job of 2 ranks, straggler rank 1>" in zero["repr"]
    line = (
        f"rank 1 of 2 in job {job}: {one['batches']} steps, "
        f"{fmt_ms(by_rank[1]['step_ms_median'])} median step; the job's report is on rank 0"
    )
    assert one["text"] == line and one["repr"] == line
    assert one["html"].count("<div") == 1 and escape(line) in one["html"]
    assert one["ranks"] is None and one["job"]["gathered"] and not one["notes"]
    alone = json.loads((out_dir / "alone0.json").read_text())
    assert not alone["job"]["gathered"]
    assert "not every rank asked for its result within 1 s" in alone["job"]["why_not"]
    assert f"{NOT_GATHERED}: not every rank asked" in alone["text"]
    assert alone["waited_s"] >= 0.9 * torchrun_job.ALONE_TIMEOUT_S  # it did wait, and no more
    assert alone["waited_s"] < torchrun_job.ALONE_TIMEOUT_S + 60


# --- a torchrun rank's job, in this process -------------------------------------------------
@pytest.fixture
def as_rank(monkeypatch):
    """Sets this process's ``RANK``/``WORLD_SIZE``/``TORCHELASTIC_RUN_ID`` as torchrun would."""

    def set_rank(rank: int, world: int) -> None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-x")

    return set_rank


@pytest.fixture
def one_rank_group():
    """A real gloo process group of world size 1 in this process, destroyed after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def small_run(batches: int = 6):
    import torch
    from torch.utils.data import DataLoader

    from traceml_nb.session import Session

    loader = DataLoader(torch.arange(4 * batches), batch_size=4)
    with Session(store=False).run("job-rank", sample=False) as run:
        for _ in loader:
            pass
    return run


def test_without_a_process_group_each_rank_reports_its_own_with_why(as_rank):
    from traceml_nb.views.report import Report

    as_rank(1, 2)
    res = small_run().result()
    assert res.job is not None and not res.job.gathered
    assert res.job.why_not.startswith("no process group")
    (note,) = [n for n in res.capabilities.notes if NOT_GATHERED in n]
    assert note.endswith("this report is rank 1's own")
    text = str(Report.of(res))
    assert text.startswith("traceml report:") and note in text
    assert res.ranks is None and res.to_dict()["job"]["why_not"] == res.job.why_not


def test_a_process_group_of_another_size_is_one_note(as_rank, one_rank_group):
    as_rank(0, 2)
    res = small_run().result()
    assert res.job.why_not == "the process group is rank 0 of 1, the environment says rank 0 of 2"
    assert sum(NOT_GATHERED in n for n in res.capabilities.notes) == 1
    assert res.summary.total_steps == 6  # the rank's own report stands


def test_a_job_of_one_rank_has_nothing_to_gather_and_says_so_only_in_its_data(
    as_rank, one_rank_group
):
    as_rank(0, 1)
    res = small_run().result()
    assert res.job.why_not == "the job has one rank" and not res.job.gathered
    assert not any(NOT_GATHERED in n for n in res.capabilities.notes)


def test_a_run_outside_a_job_has_no_job(one_rank_group):
    res = small_run().result()
    assert res.job is None
    assert not any(NOT_GATHERED in n for n in res.capabilities.notes)


def test_the_gather_goes_through_a_group_of_its_own(one_rank_group):
    from traceml_nb.session.job import gather_figures

    dist = one_rank_group
    own = RankFigures(0, steps=3, step_ms_median=2.5, data_wait_share=0.1, pid=1, stored_id=7)
    assert gather_figures(own, 1, 5.0, dist) == [own]
    assert dist.is_initialized() and dist.get_world_size() == 1  # the job's group is untouched


def test_a_rank_other_than_0_shows_one_line_and_keeps_its_data(as_rank):
    from traceml_nb.views.report import Report

    as_rank(1, 2)
    res = small_run(batches=5).result()
    res.job.gathered, res.job.why_not = True, None  # as after a gather
    report = Report.of(res)
    line = (
        f"rank 1 of 2 in job job-x: 5 steps, {fmt_ms(res.summary.step_ms_median)} median step; "
        "the job's report is on rank 0"
    )
    assert str(report) == line and repr(res) == line
    assert report._repr_html_().count("<div") == 1 and escape(line) in report._repr_html_()
    assert res.summary.total_steps == 5 and len(res.steps) == 5
    failed = job_line(JobRank(3, 4), res.summary, "failed", "ValueError: x")
    assert failed.startswith("rank 3 of 4: failed (ValueError: x), 5 steps, ")


def test_a_failed_gather_says_why_in_words():
    from traceml_nb.session.job import failure_reason

    timeout = RuntimeError("wait timeout after 1000ms, keys: /default_pg/0//1//cpu//0/1")
    assert failure_reason(timeout, 30.0).startswith(
        "not every rank asked for its result within 30 s"
    )
    assert failure_reason(ValueError("bad\nmore"), 30.0) == "ValueError: bad"


def test_the_gather_timeout_outlasts_what_delays_a_rank():
    from traceml_nb.session.job import GATHER_TIMEOUT_S
    from traceml_nb.session.store import BUSY_TIMEOUT_S

    # a rank waits at most the store's busy timeout for another rank's write before the gather
    assert GATHER_TIMEOUT_S >= 5 * BUSY_TIMEOUT_S


def test_figures_from_another_rank_are_checked():
    f = RankFigures(1, steps=4, step_ms_median=3.0, stored_id=2)
    assert RankFigures.from_dict(f.to_dict()) == f
    for bad in (None, {"rank": "1", "status": "completed", "steps": 1}, {"rank": 1}):
        with pytest.raises(ValueError):
            RankFigures.from_dict(bad)


def test_the_leak_check_sees_a_patch_left_behind():
    from leakcheck import leak_report

    from traceml_nb.engine.instrument import launch_patch as ranks

    ranks.install(lambda original, *args: original(*args))
    try:
        assert "torch.multiprocessing.start_processes is still patched" in leak_report(0.0)
    finally:
        ranks.uninstall()
    assert leak_report(0.0) == []
