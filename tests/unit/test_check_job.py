"""The CI gate on a ``torchrun`` job: the job is judged as one unit (its slowest rank against the
slowest ranks of earlier whole jobs), whatever order its ranks were stored in; a partial job has
no verdict. A real SQLite store holding runs tagged as ``torchrun`` ranks tag them."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from store_helpers import ENV, REPO, make_run

import traceml_nb
from traceml_nb.session.check import check
from traceml_nb.session.store import Store
from traceml_nb.session.stored_jobs import SLOWEST_RANK_TIE, StoredJob, split_jobs
from traceml_nb.views.check_words import check_paragraph as said

#: ranks of a baseline job: rank 1 is the slower by 2% (its 1% step jitter cannot swap them)
BASE_MS = (20.0, 20.4)
#: a rank 57% slower than the baseline jobs' slowest: a regression against two or three
#: identical jobs, whose noise is still mostly the default's (8% at 10 ms)
SLOW_MS = 32.0
#: a gate that asks about a 50% slowdown: two to four identical jobs rule that out, as the tests
#: of which jobs make the baseline need (ruling out 10% takes more runs at the default noise)
LENIENT = 0.5


def job_id(k: int) -> str:
    """A torchrun-like job id (a UUID): its first 8 characters show in the verdict."""
    return f"{k:08x}-1111-2222-3333-444455556666"


def add_job(
    store: Store,
    medians: tuple[float, ...] = BASE_MS,
    *,
    job: str,
    seed: int = 0,
    order: tuple[int, ...] | None = None,
    world_size: int | None = None,
    status: dict[int, str] | None = None,
    name: str = "train",
    env: dict | None = None,
) -> dict[int, int]:
    """Store one run per rank of a job (rank k's median step ``medians[k]``), in ``order``
    (rank order by default); returns each rank's store id."""
    ids = {}
    for rank in order if order is not None else range(len(medians)):
        entry = make_run(
            name,
            step_ms=medians[rank],
            seed=seed * 10 + rank,
            status=(status or {}).get(rank, "completed"),
            env=env,
        )
        entry.rank, entry.job_id = rank, job
        entry.world_size = world_size if world_size is not None else len(medians)
        ids[rank] = store.add(entry)
    return ids


@pytest.fixture
def store(tmp_path):
    """Five whole 2-rank jobs of 'train' (@1..@10), rank 1 the slowest of each."""
    target = Store(tmp_path / "jobs.sqlite")
    for k in range(5):
        add_job(target, job=job_id(k), seed=k)
    return target


def normalised(text: str) -> str:
    return re.sub(r"@\d+", "@N", text)


# --- the verdict ------------------------------------------------------------------------------
@pytest.mark.parametrize("slow_rank", [0, 1])
def test_a_job_slower_than_its_baseline_jobs_fails_naming_its_slowest_rank(store, slow_rank):
    medians = [20.1, 20.1]
    medians[slow_rank] = 26.0  # +28% on one rank: the job runs at that rank's pace
    ids = add_job(store, tuple(medians), job=job_id(99), seed=9)
    result = check("train", store=store.path)
    assert result.exit_code == 1 and result.status == "regression", said(result)
    assert said(result).startswith(
        f"REGRESSION: 'train' job 00000063\u2026 (2 ranks, @{ids[0]} @{ids[1]}; slowest rank "
        f"{slow_rank}) is slower than its baseline, 5 jobs @2, @4, @6, @8, @10 "
        "(each job by its slowest rank): step time 20.4 ms \u2192 2"
    )
    assert "the gate is set to catch a slowdown of 10%" in said(result)
    assert result.slowdown == pytest.approx(26.0 / 20.4 - 1, abs=0.02)
    assert result.candidate is not None and result.candidate.stored_id == ids[slow_rank]
    data = result.to_dict()
    assert data["candidate"] == ids[slow_rank]
    assert data["job"]["job_id"] == job_id(99)
    assert data["job"]["ids"] == [ids[0], ids[1]]
    assert (data["job"]["slowest_rank"], data["job"]["slowest_id"]) == (slow_rank, ids[slow_rank])
    assert [j["slowest_rank"] for j in data["baseline_jobs"]] == [1] * 5


def test_a_job_as_fast_as_its_baseline_jobs_passes(store):
    add_job(store, (20.1, 20.3), job=job_id(99), seed=9)
    result = check("train", store=store.path)
    assert result.exit_code == 0, said(result)
    assert said(result).startswith(
        "OK: 'train' job 00000063\u2026 (2 ranks, @11 @12; slowest rank 1) against its baseline, "
        "5 jobs @2, @4, @6, @8, @10 (each job by its slowest rank): step time 20.4 ms \u2192 "
    )
    assert "not slower: a slowdown of 10% is ruled out" in said(result)


def test_a_job_slower_by_well_under_the_gates_slowdown_passes(store):
    """+15% against a gate set to catch 50%: under half of it, and 50% is ruled out."""
    add_job(store, (20.1, 23.5), job=job_id(99), seed=9)
    result = check("train", store=store.path, max_slowdown=0.5)
    assert result.exit_code == 0, said(result)
    assert "not slower: a slowdown of 50% is ruled out" in said(result)


@pytest.mark.parametrize("medians", [(20.0, 32.0, 20.4), (20.0, 20.5, 21.0)])
def test_the_order_the_ranks_were_stored_in_does_not_change_the_verdict(tmp_path, medians):
    """``Store.latest`` is whichever rank wrote last; the job is the same whatever that is."""
    verdicts = set()
    for order in [(0, 1, 2), (2, 1, 0), (1, 0, 2), (0, 2, 1)]:
        target = Store(tmp_path / f"order-{''.join(map(str, order))}.sqlite")
        for k in range(4):
            add_job(target, (20.0, 20.4, 20.1), job=job_id(k), seed=k, order=order)
        ids = add_job(target, medians, job=job_id(99), seed=9, order=order)
        result = check("train", store=target.path, max_slowdown=LENIENT)
        slowest = max(range(3), key=lambda r: medians[r])
        assert result.candidate is not None and result.candidate.stored_id == ids[slowest]
        verdicts.add((result.exit_code, normalised(said(result)), round(result.slowdown, 6)))
    assert len(verdicts) == 1, verdicts
    ((code, verdict, _),) = verdicts
    assert code == (1 if max(medians) > 25 else 0)
    assert f"slowest rank {max(range(3), key=lambda r: medians[r])})" in verdict


# --- partial jobs -----------------------------------------------------------------------------
def test_a_job_with_a_failed_rank_has_no_verdict(store):
    ids = add_job(store, (20.1, 20.2), job=job_id(99), seed=9, status={1: "failed"})
    result = check("train", store=store.path)
    assert result.exit_code == 2 and result.status == "error"
    assert said(result) == (
        f"no verdict on 'train' job 00000063\u2026 (2 ranks, @{ids[0]} @{ids[1]}): the job is "
        f"partial: rank 1 (@{ids[1]}) failed: KeyboardInterrupt. A job is judged "
        "only when every rank completed and stored its run."
    )
    data = result.to_dict()
    assert data["job"]["complete"] is False and data["job"]["slowest_rank"] is None
    assert result.candidate is None and result.comparison is None
    suite = ET.fromstring(traceml_nb.check("train", store=store.path).junit()).find("testsuite")
    assert suite.get("errors") == "1"
    props = {p.get("name"): p.get("value") for p in suite.find("testcase").find("properties")}
    assert props == {"job_id": job_id(99), "ranks": f"@{ids[0]} @{ids[1]}"}


def test_a_job_with_a_rank_without_steady_steps_has_no_verdict(store):
    ranks = []
    for rank in range(2):
        entry = make_run("train", step_ms=20.0, seed=90 + rank)
        entry.rank, entry.world_size, entry.job_id = rank, 2, job_id(99)
        ranks.append(entry)
    ranks[1].summary.step_ms_median, ranks[1].step_ms = None, []
    ids = [store.add(e) for e in ranks]
    result = check("train", store=store.path)
    assert result.exit_code == 2 and result.status == "error"
    assert said(result) == (
        f"no verdict on 'train' job 00000063\u2026 (2 ranks, @{ids[0]} @{ids[1]}): rank 1 "
        f"(@{ids[1]}) measured no steady steps, so its slowest rank is not known."
    )


def test_a_job_with_fewer_ranks_stored_than_its_world_size_has_no_verdict(store):
    ids = add_job(store, (20.1, 20.2, 20.3), job=job_id(99), seed=9, order=(0, 2), world_size=4)
    result = check("train", store=store.path)
    assert result.exit_code == 2, said(result)
    assert said(result) == (
        f"no verdict on 'train' job 00000063\u2026 (2 of 4 ranks, @{ids[0]} @{ids[2]}): the job "
        "is partial: ranks 1, 3 stored no run. A job is judged only when every rank completed "
        "and stored its run."
    )


def test_partial_earlier_jobs_are_not_a_baseline(tmp_path):
    target = Store(tmp_path / "partial.sqlite")
    add_job(target, job=job_id(0), seed=0)
    add_job(target, job=job_id(1), seed=1, status={0: "interrupted"})
    add_job(target, job=job_id(2), seed=2, order=(1,))  # rank 0 never stored
    add_job(target, job=job_id(3), seed=3)
    add_job(target, (20.1, 20.3), job=job_id(99), seed=9)
    result = check("train", store=target.path, max_slowdown=LENIENT)
    assert result.exit_code == 0, said(result)
    assert [r.stored_id for r in result.baseline] == [2, 7]  # the slowest ranks of jobs 0 and 3
    assert "against its baseline, 2 jobs @2, @7" in said(result)


# --- what the baseline of a job is made of ----------------------------------------------------
def test_the_baseline_is_the_slowest_ranks_of_the_last_jobs_never_a_mix_of_ranks(tmp_path):
    target = Store(tmp_path / "mixed.sqlite")
    slowest, jobs = [], []
    for k in range(7):
        ids = add_job(target, job=job_id(k), seed=k, order=(1, 0) if k % 2 else (0, 1))
        slowest.append(ids[1])
        jobs.append([ids[0], ids[1]])
        target.add(make_run("train", step_ms=12.0, seed=50 + k))  # a run alone, much faster
    add_job(target, (20.0, 20.4, 20.2), job=job_id(40), seed=40)  # 3 ranks: another config
    ids = add_job(target, (20.2, 20.5), job=job_id(99), seed=9)
    result = check("train", store=target.path, max_slowdown=LENIENT)
    assert result.exit_code == 0, said(result)
    assert [r.stored_id for r in result.baseline] == slowest[-5:]
    assert all(r.rank == 1 and r.job_id is not None for r in result.baseline)
    assert [j.ids if j is not None else None for j in result.baseline_jobs] == jobs[-5:]
    assert all(j is not None and j.complete for j in result.baseline_jobs)
    assert result.to_dict()["baseline"] == slowest[-5:]
    assert f"(2 ranks, @{ids[0]} @{ids[1]}; slowest rank 1)" in said(result)


def test_a_job_with_only_runs_alone_before_it_has_no_baseline(tmp_path):
    target = Store(tmp_path / "alone.sqlite")
    for i in range(4):
        target.add(make_run("train", step_ms=20.0, seed=i))
    add_job(target, job=job_id(0), seed=0, order=(0,))  # rank 1 never stored
    add_job(target, (20.0, 20.5, 21.0), job=job_id(1), seed=1)
    ids = add_job(target, job=job_id(99), seed=9)
    result = check("train", store=target.path)
    assert result.exit_code == 2 and result.status == "no baseline"
    assert said(result).startswith(
        f"no baseline yet for 'train' job 00000063\u2026 (2 ranks, @{ids[0]} @{ids[1]}; slowest "
        "rank 1) on CPU: Test CPU \u00d72: no earlier complete job of 'train' with 2 ranks there "
        "(a job is compared with jobs only, never with runs that ran alone). Store 5 or more "
        "jobs of it"
    )
    assert said(result).endswith(
        "Left out: job 00000000\u2026 (1 of 2 ranks, @5) is partial (rank 1 stored no run); job "
        "00000001\u2026 (3 ranks, @6 @7 @8; slowest rank 2) had 3 ranks."
    )


def test_a_run_alone_is_compared_with_runs_alone_only(tmp_path):
    target = Store(tmp_path / "runs.sqlite")
    for i in range(3):
        target.add(make_run("train", step_ms=20.0 + 0.1 * i, seed=i))
        add_job(target, (30.0, 30.5), job=job_id(i), seed=i)  # ranks of jobs: not its baseline
    latest = target.add(make_run("train", step_ms=20.1, seed=9))
    result = check("train", store=target.path, max_slowdown=LENIENT)
    assert result.exit_code == 0, said(result)
    assert [r.stored_id for r in result.baseline] == [1, 4, 7]
    assert result.job is None and result.baseline_jobs == [None, None, None]
    assert said(result).startswith(f"OK: 'train' @{latest} against its baseline, 3 runs @1, @4, @7")
    assert result.to_dict()["job"] is None


def test_baseline_jobs_come_from_the_same_hardware_class_unless_any_hardware(store):
    other = {**ENV, "cpu_model": "Other CPU"}
    for k in range(5, 8):
        add_job(store, (15.0, 15.2), job=job_id(k), seed=k, env=other)
    add_job(store, (20.1, 20.3), job=job_id(99), seed=9)
    same = check("train", store=store.path)
    assert same.exit_code == 0 and [r.stored_id for r in same.baseline] == [2, 4, 6, 8, 10]
    crossed = check("train", store=store.path, any_hardware=True)
    assert [r.stored_id for r in crossed.baseline] == [8, 10, 12, 14, 16]


def test_a_reused_job_id_and_an_elastic_restart_are_told_apart(tmp_path):
    """torchrun's static rendezvous names every job 'none'; an elastic restart keeps the id."""
    target = Store(tmp_path / "none.sqlite")
    for k in range(3):
        add_job(target, job="none", seed=k, order=(1, 0) if k == 1 else (0, 1))
    add_job(target, (20.1, 20.3), job="none", seed=8, status={0: "failed", 1: "failed"})
    ids = add_job(target, (20.1, SLOW_MS), job="none", seed=9, order=(1, 0))  # the restart
    result = check("train", store=target.path)
    assert result.exit_code == 1, said(result)
    assert said(result).startswith(
        f"REGRESSION: 'train' job none (2 ranks, @{ids[0]} @{ids[1]}; slowest rank 1) is slower "
        "than its baseline, 3 jobs @2, @3, @6 (each job by its slowest rank)"
    )
    jobs = split_jobs(target.job_rows("train"))
    assert [j.ids for j in jobs] == [[1, 2], [4, 3], [5, 6], [7, 8], [10, 9]]
    assert [j.complete for j in jobs] == [True, True, True, False, True]


# --- pins and --against -----------------------------------------------------------------------
def test_a_pinned_rank_stands_for_its_job(store):
    store.pin("train", [1, 3, 4])  # rank 0 of job 0; ranks 0 and 1 of job 1
    add_job(store, (20.1, SLOW_MS), job=job_id(99), seed=9)
    result = check("train", store=store.path)
    assert result.exit_code == 1, said(result)
    assert [r.stored_id for r in result.baseline] == [2, 4]
    assert "2 jobs @2, @4 (each job by its slowest rank)" in said(result)


def test_against_a_rank_of_a_job_means_that_job(store):
    add_job(store, job=job_id(50), seed=50, status={1: "failed"})  # @11 @12
    # one job to judge against: the noise is the default's, so the slowdown must be large
    ids = add_job(store, (20.1, 36.0), job=job_id(99), seed=9)
    result = check("train", store=store.path, against="@3")  # rank 0 of job 1
    assert result.exit_code == 1, said(result)
    assert [r.stored_id for r in result.baseline] == [4]
    assert said(result).startswith(
        f"REGRESSION: 'train' job 00000063\u2026 (2 ranks, @{ids[0]} @{ids[1]}; slowest rank 1) "
        "is slower than its baseline, job 00000001\u2026 (2 ranks, @3 @4; slowest rank 1): "
    )
    partial = check("train", store=store.path, against=11)
    assert partial.exit_code == 2, said(partial)
    assert said(partial).startswith("--against @11: @11 is a rank of job 00000032\u2026 (2 ranks")
    assert "which is partial (rank 1 (@12) failed: KeyboardInterrupt)" in said(partial)


# --- the pieces ---------------------------------------------------------------------------------
def test_a_job_knows_its_world_its_missing_ranks_and_its_slowest_rank(store):
    (job,) = [j for j in split_jobs(store.job_rows("train")) if j.ids == [3, 4]]
    assert isinstance(job, StoredJob) and job.complete and job.world_size == 2
    assert job.slowest.rank == 1 and job.missing_ranks == [] and job.partial_reasons() == []
    assert job.label() == "job 00000001\u2026 (2 ranks, @3 @4; slowest rank 1)"
    half = StoredJob("j", [job.runs[1]])
    assert half.missing_ranks == [0] and not half.complete
    assert half.partial_reasons() == ["rank 0 stored no run"]
    assert half.label() == "job j (1 of 2 ranks, @4)"
    assert StoredJob("abcdefghi", []).short_id == "abcdefghi"  # up to 9 characters shown whole
    assert StoredJob("abcdefghij", []).short_id == "abcdefgh\u2026"


def ranks_of(medians, waits):
    """A whole job of hand-built rank runs (not stored): rank k's median step ``medians[k]``
    ms, its data wait share ``waits[k]``."""
    runs = []
    for rank, (median, wait) in enumerate(zip(medians, waits, strict=True)):
        entry = make_run("train", step_ms=median, jitter=0.0, seed=rank)
        entry.rank, entry.world_size, entry.job_id = rank, len(medians), "j"
        entry.stored_id = 100 + rank
        entry.summary.step_ms_median, entry.summary.data_wait_share = median, wait
        runs.append(entry)
    return StoredJob("j", runs)


def test_ranks_within_1_percent_are_tied_and_the_one_waiting_for_data_is_the_slowest():
    """DDP ranks wait for one another at the all-reduce: their medians differ by noise only."""
    assert SLOWEST_RANK_TIE == 0.01
    assert ranks_of((20.0, 20.19), (0.85, 0.10)).slowest.rank == 0  # 0.95% apart: tied
    assert ranks_of((20.0, 20.21), (0.85, 0.10)).slowest.rank == 1  # 1.05% apart: the longest
    assert ranks_of((20.1, 20.0, 20.05), (0.10, 0.10, 0.10)).slowest.rank == 0  # the lowest rank
    assert ranks_of((20.0, 20.1), (None, 0.10)).slowest.rank == 1  # a wait not measured: least


def test_a_ddp_job_is_compared_rank_for_rank_when_its_ranks_are_tied(tmp_path):
    """Every job's rank 1 waits for data while rank 0 waits for it: rank 1 is the slowest of
    each, whichever of the two equal medians comes out longer by noise."""
    target = Store(tmp_path / "ddp.sqlite")
    for k in range(5):
        for rank in (0, 1):
            entry = make_run("train", step_ms=20.0, seed=10 * k + rank)
            entry.rank, entry.world_size, entry.job_id = rank, 2, job_id(k)
            entry.summary.data_wait_share = 0.85 if rank == 1 else 0.05
            target.add(entry)
    medians = [r.step_ms_median for r in target.rows()]
    assert any(medians[i] > medians[i + 1] for i in range(0, 10, 2))  # noise flips the longest
    result = check("train", store=target.path, against="baseline", max_slowdown=LENIENT)
    assert result.candidate is not None and result.candidate.rank == 1
    assert [r.rank for r in result.baseline] == [1, 1, 1, 1]
    assert result.exit_code == 0 and "same code, same settings" in said(result).lower()


def test_the_cli_gates_a_job_with_markdown_and_junit(store, tmp_path):
    ids = add_job(store, (26.0, 20.1), job=job_id(99), seed=9, order=(1, 0))
    junit = tmp_path / "gate.xml"
    done = subprocess.run(
        [sys.executable, "-m", "traceml_nb", "check", "--name", "train", "--store", store.path,
         "--format", "markdown", "--junit", str(junit)],
        capture_output=True, text=True, timeout=300, cwd=str(REPO), check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith("### \u274c traceml_nb check: `train` \u2014 regression")
    assert (
        f"REGRESSION: 'train' job 00000063\u2026 (2 ranks, @{ids[0]} @{ids[1]}; slowest rank 0) "
        "is slower than its baseline, 5 jobs" in out
    )
    assert re.search(
        rf"\*\*Job\*\* `{job_id(99)}`: rank 0 @{ids[0]} 2[56]\.\d ms \(slowest\), "
        rf"rank 1 @{ids[1]} 20\.\d ms\n",
        out,
    ), out
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "1"
    case = suite.find("testcase")
    props = {p.get("name"): p.get("value") for p in case.find("properties")}
    assert props == {
        "job_id": job_id(99),
        "ranks": f"@{ids[0]} @{ids[1]}",
        "slowest_rank": "0",
    }
    assert "slowest rank 0" in case.find("failure").get("message")
    assert traceml_nb.check("train", store=store.path).to_dict()["job"]["slowest_rank"] == 0


def test_the_store_reads_a_job_in_rank_order_and_runs_alone_apart(tmp_path):
    target = Store(tmp_path / "reads.sqlite")
    target.add(make_run("train", seed=1))  # @1, alone
    add_job(target, (20.0, 20.1, 20.2), job="j", order=(2, 0, 1))  # @2 rank 2, @3 rank 0, @4
    add_job(target, (20.0,), job="j", name="eval", world_size=3)  # the same job, another name
    assert [(r.rank, r.stored_id) for r in target.job_runs("j", name="train")] == [
        (0, 3),
        (1, 4),
        (2, 2),
    ]
    assert [r.name for r in target.job_runs("j")] == ["train", "eval", "train", "train"]
    assert [r.id for r in target.job_rows("train")] == [2, 3, 4]
    assert [r.stored_id for r in target.entries([4, 1, 99])] == [1, 4]
    assert [r.stored_id for r in target.baseline("train", hardware=None, alone=True)] == [1]
    assert [r.stored_id for r in target.baseline("train", hardware=None)] == [1, 2, 3, 4]


def test_a_ranks_own_report_is_compared_with_the_same_rank_of_earlier_jobs(store):
    """``Session.baseline_for`` (each rank's report): rank 1 of a new job against rank 1 of the
    earlier jobs, not against rank 0 stored a moment before it in the same job; a run alone
    against runs alone only."""
    from traceml_nb.session import Session

    new = add_job(store, job=job_id(99), seed=9)
    entry = store.get(new[1])
    chosen = Session(store=store.path).baseline_for(entry, store)
    runs, note = chosen.runs, chosen.note
    assert note == ""
    assert [r.rank for r in runs] == [1] * 5 and all(r.job_id != job_id(99) for r in runs)
    alone_id = store.add(make_run("train", step_ms=20.0, seed=77))
    runs = Session(store=store.path).baseline_for(store.get(alone_id), store).runs
    assert runs == []  # the 10 ranks of jobs are no baseline of a run alone


def test_the_slowest_rank_of_a_ddp_job_is_its_straggler_by_data_wait(tmp_path):
    """DDP ranks take the straggler's step time, so their medians differ by noise: rank 0's
    2.5% longer median (past the tie) does not make it the slowest when rank 1 waits for data
    most of its step; without such a data wait the longer median decides."""
    target = Store(tmp_path / "ddp.sqlite")
    ids = {}
    for rank, (step_ms, wait_ms) in enumerate([(20.5, 1.0), (20.0, 15.0)]):
        entry = make_run("ddp", step_ms=step_ms, seed=rank, wait_ms=wait_ms)
        entry.rank, entry.world_size, entry.job_id = rank, 2, job_id(1)
        ids[rank] = target.add(entry)
    (job,) = split_jobs(target.job_runs(job_id(1)))
    assert job.slowest.rank == 1 and job.slowest.id == ids[1]
    assert split_jobs(target.job_rows("ddp"))[0].slowest.rank == 1  # the stored rows alike
    even = Store(tmp_path / "even.sqlite")
    for rank, step_ms in enumerate([20.5, 20.0]):
        entry = make_run("ddp", step_ms=step_ms, seed=rank, wait_ms=1.0)
        entry.rank, entry.world_size, entry.job_id = rank, 2, job_id(2)
        even.add(entry)
    (job,) = split_jobs(even.job_runs(job_id(2)))
    assert job.slowest.rank == 0


def test_a_jobs_baseline_is_the_jobs_given_the_same_arguments_but_each_ranks_own(tmp_path):
    """Jobs of ``--model small`` and ``--model big`` in turn, each rank given its own
    ``--local-rank=N`` (as ``torch.distributed.launch`` passes it): a big job is judged against
    the big jobs; the rank's own argument tells nothing apart."""
    from traceml_nb.session.environment import argument_values, script_args_sha

    target = Store(tmp_path / "models.sqlite")
    for k, model in enumerate(["small", "big"] * 3 + ["big"]):
        for rank in range(2):
            argv = [f"--local-rank={rank}", "--model", model]
            env = {**ENV, "script_sha": "a" * 16, "script_args_sha": script_args_sha(argv)}
            env["script_args"] = argument_values(argv)
            slower = rank if k < 6 else 1 - rank  # the last job's slowest rank is rank 0
            step_ms = (10.0 if model == "small" else 20.0) * (1 + 0.02 * slower)
            entry = make_run("train", step_ms=step_ms, seed=k * 10 + rank, source=None, env=env)
            entry.rank, entry.job_id, entry.world_size = rank, job_id(k), 2
            target.add(entry)
    result = check("train", store=target.path, max_slowdown=LENIENT)
    assert result.exit_code == 0, said(result)
    medians = [r.summary.step_ms_median for r in result.baseline]
    assert medians == pytest.approx([20.4] * 3, rel=0.03)
    assert result.baseline_split_by == ("--model",)
    assert "given the same arguments (--model)" in said(result)
    # rank 0 against the earlier jobs' rank 1: their --local-rank is no change of the work
    assert said(result).endswith("Same code, same settings, same machine, same machine load.")


def test_a_jobs_history_is_not_split_by_which_rank_was_slowest(tmp_path):
    """One point a job, its slowest rank's: which rank that was (and so its ``--local-rank``)
    changes from job to job, and tells no jobs apart nor comes with a shift."""
    from traceml_nb.session.environment import argument_values, script_args_sha
    from traceml_nb.session.shifts import name_shifts

    target = Store(tmp_path / "history.sqlite")
    for k in range(14):
        for rank in range(2):
            argv = [f"--local-rank={rank}", "--model", "big"]
            env = {**ENV, "script_sha": "a" * 16, "script_args_sha": script_args_sha(argv)}
            env["script_args"] = argument_values(argv)
            step_ms = 20.0 * (1.03 if rank == k % 2 else 1.0) * (1.25 if k >= 8 else 1.0)
            entry = make_run("train", step_ms=step_ms, seed=k * 10 + rank, source=None, env=env)
            entry.rank, entry.job_id, entry.world_size = rank, job_id(k), 2
            target.add(entry)
    history = name_shifts(target, "train")
    assert len(history.runs) == 14 and history.split_by == ()
    assert {r.rank for r in history.runs} == {0, 1}
    # a shift at the ninth job, whose slowest rank is not the eighth's: not "--local-rank"
    assert [s.after.job_id for s in history.found] == [job_id(8)]
    assert history.found[0].changes.argument_names == []
    assert history.found[0].changes.arguments is None
