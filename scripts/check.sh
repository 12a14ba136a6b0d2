#!/usr/bin/env bash
# Lint, type-check and run the test suite (after scripts/setup.sh --test).
#   scripts/check.sh            the whole suite: tests/unit, tests/integration, tests/browser
#   scripts/check.sh --fast     lint, types and tests/unit only (under a minute)
# Other arguments go to pytest. The type check runs beside the tests, in the time of the unit
# tier (first: pure tests that time nothing); its output, and its failure, come after theirs.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    tests=(tests/unit)
fi
.venv/bin/ruff check traceml_nb tests benchmarks
.venv/bin/ruff format --check traceml_nb tests benchmarks
mkdir -p out
.venv/bin/mypy traceml_nb >out/mypy.log 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true' EXIT
# the 30 slowest tests in the log; every test's time in out/test-times.xml (JUnit), to keep the suite fast
pytest_status=0
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 --junitxml=out/test-times.xml \
    "${tests[@]}" "$@" || pytest_status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
echo "mypy traceml_nb:"
cat out/mypy.log
if ((pytest_status != 0)); then exit "$pytest_status"; fi
exit "$mypy_status"
