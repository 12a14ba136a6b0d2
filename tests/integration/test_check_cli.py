"""The CI gate: ``python -m traceml_nb check`` in a subprocess on a real store, its exit codes,
its markdown and JUnit outputs, and the same as ``traceml_nb.check(...)``."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from store_helpers import REPO, cli, make_run, python

import traceml_nb
from traceml_nb.analysis.noise import is_busy
from traceml_nb.session.store import Store


@pytest.fixture
def store(tmp_path):
    """Five baseline runs of 'smoke' at ~20 ms (1% step jitter, 1% run-to-run)."""
    target = Store(tmp_path / "ci.sqlite")
    for i, median in enumerate([20.0, 20.2, 19.8, 20.1, 19.9]):
        target.add(make_run("smoke", step_ms=median, seed=i))
    return target


def test_exit_0_when_the_latest_run_is_not_slower(store):
    store.add(make_run("smoke", step_ms=20.1, seed=11))
    done = cli("check", "--name", "smoke", "--store", store.path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: 'smoke' @6 against its baseline, 5 runs @1\u2013@5")
    assert "not slower: a slowdown of 10% is ruled out" in done.stdout
    # the bound that decided, at the level that decided it, below the slowdown ruled out
    at_most = re.search(r"; at most ([+\u2212±][0-9.]+)% with 90% confidence\)", done.stdout)
    assert at_most and float(at_most.group(1).replace("\u2212", "-").lstrip("±")) < 10
    assert len(done.stdout.strip().splitlines()) == 1  # one paragraph


def test_exit_1_on_a_regression_with_markdown_and_junit(store, tmp_path):
    store.add(make_run("smoke", step_ms=30.0, seed=12, source="train(loader)\nsleep(0.010)\n"))
    junit = tmp_path / "gate.xml"
    done = cli(
        "check",
        "--name",
        "smoke",
        "--store",
        store.path,
        "--format",
        "markdown",
        "--junit",
        str(junit),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith("### \u274c traceml_nb check: `smoke` \u2014 regression")
    assert "REGRESSION: 'smoke' @6 is slower than its baseline, 5 runs" in out
    assert "of the configuration before it" in out  # the cell changed: a new configuration
    assert "beyond the run-to-run noise (5 runs of this configuration)" in out
    at_least = re.search(r"\(\+50%; at least \+([0-9.]+)% with 99.5% confidence\)", out)
    assert at_least and float(at_least.group(1)) > 0, out
    assert re.search(
        r"\| median step time \(mean of 5 runs\) \| 20(\.\d)? ms \| 30(\.\d)? ms \| \+50% \|", out
    )
    assert "- cell source: + sleep(0.010)" in out
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "1" and suite.get("tests") == "1"
    case = suite.find("testcase")
    assert case.get("name") == "smoke"
    assert "REGRESSION" in case.find("failure").get("message")


@pytest.mark.parametrize(
    ("median", "max_slowdown", "code"),
    [(24.0, "0.5", 0), (24.0, "0.3", 3), (30.0, "0.8", 1), (30.0, "1.2", 0)],
)
def test_a_slowdown_under_half_the_gates_passes_and_over_half_fails(
    store, median, max_slowdown, code
):
    """The gate catches a slowdown of --max-slowdown: +20% against 50% and +50% against 120%
    (under half of it, and it ruled out) pass; +50%, surely slower and over half of 80%, fails;
    +20% against 30% is over half of it but not surely slower from five runs at the default
    noise, nor is 30% ruled out: inconclusive."""
    store.add(make_run("smoke", step_ms=median, seed=12))
    done = cli("check", "--name", "smoke", "--store", store.path, "--max-slowdown", max_slowdown)
    assert done.returncode == code, done.stdout
    if code == 0:
        assert f"not slower: a slowdown of {float(max_slowdown):.0%} is ruled out" in done.stdout


def test_exit_2_without_a_baseline_or_a_store(tmp_path):
    target = Store(tmp_path / "one.sqlite")
    target.add(make_run("smoke"))
    junit = tmp_path / "none.xml"
    done = cli("check", "--name", "smoke", "--store", target.path, "--junit", str(junit))
    assert done.returncode == 2
    assert done.stdout.startswith("no baseline yet for 'smoke' on CPU: Test CPU \u00d72")
    assert ET.parse(junit).getroot().find("testsuite").get("skipped") == "1"
    assert cli("check", "--name", "other", "--store", target.path).returncode == 2
    missing = cli("check", "--name", "smoke", "--store", str(tmp_path / "nope.sqlite"))
    assert missing.returncode == 2 and "there is no store at" in missing.stdout
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not sqlite" * 100)
    bad = cli("check", "--name", "smoke", "--store", str(corrupt), "--junit", str(junit))
    assert bad.returncode == 2 and "not a readable SQLite database" in bad.stdout
    assert ET.parse(junit).getroot().find("testsuite").get("errors") == "1"


def test_usage_errors_exit_2(store):
    assert cli("check").returncode == 2  # --name is required
    assert cli("check", "--name", "smoke", "--max-slowdown", "lots").returncode == 2
    assert cli("frobnicate").returncode == 2
    done = cli("check", "--name", "smoke", "--store", store.path, "--against", "x")
    assert done.returncode == 2 and "--against must be" in done.stdout


def test_the_help_says_what_every_command_is_for():
    from traceml_nb.__main__ import parser

    top = parser()
    commands = top._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {"check", "ab", "export", "import"}
    for name in commands:  # the description, printed first by --help, names each one
        assert re.search(rf"\b{name}\b", top.description or ""), name


def test_against_one_stored_run(store):
    store.add(make_run("smoke", step_ms=30.0, seed=13))
    done = cli("check", "--name", "smoke", "--store", store.path, "--against", "@1")
    assert done.returncode == 1
    assert "than its baseline, run @1: step time" in done.stdout


def test_the_api_returns_the_same(store):
    store.add(make_run("smoke", step_ms=26.0, seed=14))
    report = traceml_nb.check("smoke", store=store.path)
    assert report.exit_code == 1 and not report.passed, report.text()
    assert report.result.slowdown == pytest.approx(0.3, abs=0.03)
    assert report.text().startswith("REGRESSION")
    assert report._repr_markdown_() == report.markdown()
    assert report.to_dict()["baseline"] == [1, 2, 3, 4, 5]
    assert traceml_nb.check("smoke", store=store.path, max_slowdown=0.8).exit_code == 0


def test_a_larger_batch_is_judged_per_sample(store):
    """Batch 8 → 16: a step 80% longer is 10% less time a sample, not a regression. The
    paragraph says which time it judged and why."""
    store.add(make_run("smoke", step_ms=36.0, seed=15, batch_size=16))
    report = traceml_nb.check("smoke", store=store.path)
    assert report.exit_code == 0, report.text()
    assert report.result.slowdown == pytest.approx(-0.1, abs=0.02)
    text = report.text()
    assert (
        "against its baseline, 5 runs @1\u2013@5 of the configuration before it: time per " in text
    )
    assert (
        "The batch size went 8 \u2192 16, so the steps are compared per sample (step time 20 ms "
        "\u2192 36.1 ms, +80%). What changed: DataLoader: batch_size 8 \u2192 16." in text
    )


def test_a_larger_batch_slower_per_sample_is_a_regression(store):
    store.add(make_run("smoke", step_ms=60.0, seed=16, batch_size=16))  # +50% a sample
    report = traceml_nb.check("smoke", store=store.path)
    assert report.exit_code == 1, report.text()
    assert report.text().startswith("REGRESSION: 'smoke' @6 is slower than its baseline")
    assert report.result.slowdown == pytest.approx(0.5, abs=0.03)


def test_the_worked_ci_example_fails_when_the_steps_get_half_again_slower(tmp_path):
    """README's example: the smoke test runs five times (the baseline) and once more; the gate
    does not call that slower; then with 6 ms more per ~12 ms step (+50%), and the gate fails
    it. A single run judged against five cannot catch +10-20% reliably on a noisy machine (the
    indifference zone; ``ab`` is the gate for that): +50% it must. Should the slower run itself
    meet a busy machine (other work on a CI runner) while its baseline ran quiet, it is judged
    with ``BUSY_NOISE_FACTOR`` times the noise: then inconclusive may be the honest answer, and
    the paragraph names the load; never "not slower"."""
    env = {"TRACEML_NB_STORE": str(tmp_path / "ci.sqlite")}
    script = (REPO / "docs" / "ci_smoke.py").read_text()
    for _ in range(6):
        done = python(script, env={**env, "SMOKE_EXTRA_MS": "0"})
        assert done.returncode == 0, done.stderr
    same = cli("check", "--name", "smoke", env=env)
    assert same.returncode in (0, 3), same.stdout  # never a regression; 3 on a noisy day
    done = python(script, env={**env, "SMOKE_EXTRA_MS": "6"})
    assert done.returncode == 0, done.stderr
    slower = cli("check", "--name", "smoke", env=env)
    runs = Store(tmp_path / "ci.sqlite").rows()
    if is_busy(runs[-1].load) and not all(is_busy(r.load) for r in runs[:-1]):
        assert slower.returncode in (1, 3), same.stdout + "\n" + slower.stdout
        assert "machine load" in slower.stdout or "steal" in slower.stdout, slower.stdout
    else:
        assert slower.returncode == 1, same.stdout + "\n" + slower.stdout
    if slower.returncode == 1:
        assert slower.stdout.startswith("REGRESSION: 'smoke' @7 is slower than its baseline")


# --- --runs K: the job trained K times -----------------------------------------------------------
def add_changed(store: Store, medians: list[float], seed: int = 20) -> list[int]:
    """Runs of 'smoke' whose cell changed (a new configuration), one per median (ms)."""
    return [
        store.add(make_run("smoke", step_ms=m, seed=seed + i, source="train(loader)\nextra()\n"))
        for i, m in enumerate(medians)
    ]


def test_three_runs_together_catch_a_slowdown_one_run_cannot_tell(store):
    """+17% after a change: the latest run alone is inconclusive against five baseline runs
    (its noise is the default's, mostly); the job's three runs together are a regression (the
    mean of three has a third of one run's variance)."""
    ids = add_changed(store, [23.3, 23.5, 23.7])
    one = traceml_nb.check("smoke", store=store.path)
    assert one.exit_code == 3, one.text()
    three = traceml_nb.check("smoke", store=store.path, runs=3)
    assert three.exit_code == 1, three.text()
    text = three.text()
    assert text.startswith(
        f"REGRESSION: 'smoke' @{ids[0]}\u2013@{ids[-1]} (its latest 3 runs) is slower than its "
        "baseline, 5 runs @1\u2013@5 of the configuration before it: step time 20 ms \u2192 23.5 ms"
    )
    assert "(8 runs of 2 configurations)" in text  # the three runs' own scatter is noise too
    result = three.result
    assert [r.stored_id for r in result.candidates] == ids
    assert result.to_dict()["candidates"] == ids
    assert result.comparison.candidate_ids == ids
    assert result.slowdown == pytest.approx(23.5 / 20.0 - 1, abs=0.01)
    assert "| median step time (means of 5 and 3 runs) |" in three.markdown()


def test_three_identical_runs_pass_where_one_is_inconclusive(store):
    ids = add_changed(store, [20.3, 19.9, 20.1])
    assert traceml_nb.check("smoke", store=store.path).exit_code in (0, 3)
    three = cli("check", "--name", "smoke", "--store", store.path, "--runs", "3")
    assert three.returncode == 0, three.stdout
    assert three.stdout.startswith(f"OK: 'smoke' @{ids[0]}\u2013@{ids[-1]} (its latest 3 runs)")
    assert "not slower: a slowdown of 10% is ruled out" in three.stdout


def test_against_one_stored_run_with_runs_k(store):
    """``--against @N --runs K``: the K latest runs judged together against run @N; @N among
    the K is a usage error (a run cannot be its own baseline), @N before them a verdict."""
    ids = add_changed(store, [23.3, 23.5, 23.7])
    among = traceml_nb.check("smoke", store=store.path, runs=3, against=f"@{ids[1]}")
    assert among.exit_code == 2 and among.result.status == "error"
    assert among.text() == f"--against @{ids[1]} is one of the runs checked"
    before = traceml_nb.check("smoke", store=store.path, runs=3, against="@5")
    assert before.exit_code in (1, 3), before.text()
    assert [r.stored_id for r in before.result.baseline] == [5]
    assert [r.stored_id for r in before.result.candidates] == ids
    assert before.text().startswith(
        f"{'REGRESSION' if before.exit_code == 1 else 'INCONCLUSIVE'}: 'smoke' "
        f"@{ids[0]}\u2013@{ids[-1]} (its latest 3 runs)"
    )
    assert "run @5" in before.text()


def test_a_longer_baseline_knows_its_noise_better(store):
    """``--baseline-runs N``: the last N runs of the configuration. +10% from three runs
    against five baseline runs is inconclusive; against fifteen (the same machine, the same
    scatter) the baseline's mean is known well enough to call it."""
    for i, median in enumerate([20.1, 19.9, 20.0, 20.2, 19.8, 20.0, 20.1, 19.9, 20.0, 20.1]):
        store.add(make_run("smoke", step_ms=median, seed=40 + i))
    ids = [
        store.add(make_run("smoke", step_ms=m, seed=60 + i))
        for i, m in enumerate([21.9, 22.0, 22.1])
    ]
    five = traceml_nb.check("smoke", store=store.path, runs=3)
    assert [r.stored_id for r in five.result.baseline] == list(range(ids[0] - 5, ids[0]))
    fifteen = cli("check", "--name", "smoke", "--store", store.path, "--runs", "3",
                  "--baseline-runs", "15")  # fmt: skip
    assert fifteen.returncode == 1, fifteen.stdout
    assert "against its baseline" not in fifteen.stdout
    assert f"is slower than its baseline, 15 runs @1\u2013@{ids[0] - 1}" in fifteen.stdout
    assert five.exit_code == 3, five.text()
    for bad in ("1", "51", "x"):
        done = cli("check", "--name", "smoke", "--store", store.path, "--baseline-runs", bad)
        assert done.returncode == 2, done.stdout + done.stderr
    edge = traceml_nb.check("smoke", store=store.path, baseline_runs=50)
    assert edge.exit_code != 2 and len(edge.result.baseline) == ids[-1] - 1  # all it has
    assert traceml_nb.check("smoke", store=store.path, baseline_runs=2).exit_code != 2
    refused = traceml_nb.check("smoke", store=store.path, baseline_runs=1)
    assert refused.text() == "--baseline-runs must be a whole number from 2 to 50, got 1"


def test_runs_must_be_the_latest_runs_of_one_configuration(store):
    store.add(make_run("smoke", step_ms=20.0, seed=30, source="train(loader)\nother()\n"))
    add_changed(store, [20.0, 20.1])
    mixed = traceml_nb.check("smoke", store=store.path, runs=3)
    assert mixed.exit_code == 2, mixed.text()
    assert mixed.text() == (
        "--runs 3: the latest 3 stored runs of 'smoke' are judged together, and @6 is of another "
        "configuration than @8: each must be a completed run of one configuration and values, "
        "alone, on one machine class (the CI job trained that many times in a row)"
    )
    assert traceml_nb.check("smoke", store=store.path, runs=2).exit_code in (0, 3)
    too_many = traceml_nb.check("smoke", store=store.path, runs=9)
    assert too_many.exit_code == 2
    assert "are judged together, and it has 8" in too_many.text()
    store.add(make_run("smoke", step_ms=20.0, seed=31, status="interrupted"))
    stopped = traceml_nb.check("smoke", store=store.path, runs=2)
    assert stopped.exit_code == 2 and "and @9 interrupted:" in stopped.text()
    for bad in ("0", "21", "x"):
        done = cli("check", "--name", "smoke", "--store", store.path, "--runs", bad)
        assert done.returncode == 2, done.stdout + done.stderr
    assert traceml_nb.check("smoke", store=store.path, runs=True).exit_code == 2


def test_a_busy_run_among_the_k_is_left_out_as_from_a_baseline(store):
    """Judging a busy run with the quiet ones would multiply the noise of all by
    BUSY_NOISE_FACTOR (or bias their mean); the quiet ones are judged and the paragraph says
    which was left out. All of them busy: judged with that noise."""
    source = "train(loader)\nextra()\n"
    ids = [
        store.add(make_run("smoke", step_ms=m, seed=40 + i, source=source, load=load))
        for i, (m, load) in enumerate([(20.1, 0.0), (27.0, 0.6), (19.9, 0.0)])
    ]
    report = traceml_nb.check("smoke", store=store.path, runs=3)
    result = report.result
    assert [r.stored_id for r in result.candidates] == [ids[0], ids[2]]
    assert [r.stored_id for r in result.left_out] == [ids[1]]
    assert result.to_dict()["left_out"] == [ids[1]]
    assert report.text().split(" against ")[0].split(": ", 1)[1] == (
        f"'smoke' @{ids[0]}\u2013@{ids[2]} (its latest 3 runs; @{ids[1]} left out: it ran on a "
        "busy machine)"
    )
    assert result.exit_code != 1 and not result.comparison.after_busy
    busy = Store(store.path)
    for i in range(3):
        busy.add(make_run("smoke", step_ms=24.0, seed=50 + i, source="b()\n", load=0.6))
    everyone = traceml_nb.check("smoke", store=store.path, runs=3).result
    assert everyone.left_out == [] and len(everyone.candidates) == 3
    assert everyone.comparison.after_busy and everyone.exit_code in (1, 3)
