"""The CI gate: ``python -m traceml_nb check`` in a subprocess on a real store, its exit codes,
its markdown and JUnit outputs, and the same as ``traceml_nb.check(...)``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from store_helpers import REPO, make_run, python

import traceml_nb
from traceml_nb.session.store import Store


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m traceml_nb ARGS`` in a subprocess (``env`` added to this one's)."""
    return subprocess.run(
        [sys.executable, "-m", "traceml_nb", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        env={**os.environ, **(env or {})},
        check=False,
    )


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
    assert done.stdout.startswith("OK: 'smoke' @6 against the median of 5 runs @1\u2013@5")
    assert "not slower: a slowdown of 10% is ruled out" in done.stdout
    assert len(done.stdout.strip().splitlines()) == 1  # one paragraph


def test_exit_1_on_a_regression_with_markdown_and_junit(store, tmp_path):
    store.add(make_run("smoke", step_ms=24.0, seed=12, source="train(loader)\nsleep(0.004)\n"))
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
    assert "REGRESSION: 'smoke' @6 is slower than its baseline, the median of 5 runs" in out
    assert "of the configuration before it" in out  # the cell changed: a new configuration
    assert "beyond the run-to-run noise (5 runs of this configuration)" in out
    assert re.search(
        r"\| median step time \(mean of 5 runs\) \| 20(\.\d)? ms \| 24(\.\d)? ms \| \+20% \|", out
    )
    assert "- cell source: + sleep(0.004)" in out
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "1" and suite.get("tests") == "1"
    case = suite.find("testcase")
    assert case.get("name") == "smoke"
    assert "REGRESSION" in case.find("failure").get("message")


def test_a_slowdown_well_under_the_gates_slowdown_passes(store):
    """The gate catches a slowdown of --max-slowdown; one under half of it, with that slowdown
    ruled out, passes; one over half of it, surely slower, fails."""
    store.add(make_run("smoke", step_ms=24.0, seed=12))
    done = cli("check", "--name", "smoke", "--store", store.path, "--max-slowdown", "0.5")
    assert done.returncode == 0, done.stdout
    assert "not slower: a slowdown of 50% is ruled out" in done.stdout
    near = cli("check", "--name", "smoke", "--store", store.path, "--max-slowdown", "0.3")
    assert near.returncode == 1, near.stdout  # +20%: over half of 30%, and surely slower


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


def test_the_worked_ci_example_fails_when_steps_get_20_percent_slower(tmp_path):
    """README's example: the smoke test runs five times (the baseline) and once more; the gate
    does not call that slower; then with 2 ms more per 10 ms step, and the gate fails it."""
    env = {"TRACEML_NB_STORE": str(tmp_path / "ci.sqlite")}
    script = (REPO / "docs" / "ci_smoke.py").read_text()
    for _ in range(6):
        done = python(script, env={**env, "SMOKE_EXTRA_MS": "0"})
        assert done.returncode == 0, done.stderr
    same = cli("check", "--name", "smoke", env=env)
    assert same.returncode in (0, 3), same.stdout  # never a regression; 3 on a noisy day
    done = python(script, env={**env, "SMOKE_EXTRA_MS": "2"})
    assert done.returncode == 0, done.stderr
    slower = cli("check", "--name", "smoke", env=env)
    assert slower.returncode == 1, same.stdout + "\n" + slower.stdout
    assert slower.stdout.startswith("REGRESSION: 'smoke' @7 is slower than its baseline")
