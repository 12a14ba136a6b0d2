#!/usr/bin/env bash
# Lint, type-check and run the test suite (after scripts/setup.sh --test).
#   scripts/check.sh            the whole suite: tests/unit, tests/integration, tests/browser
#   scripts/check.sh --fast     lint, types and tests/unit only (about a minute)
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    tests=(tests/unit)
fi
.venv/bin/ruff check traceml_nb tests benchmarks
.venv/bin/ruff format --check traceml_nb tests benchmarks
.venv/bin/mypy traceml_nb
# the 30 slowest tests in the log; every test's time in out/test-times.xml (JUnit), to keep the suite fast
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 --junitxml=out/test-times.xml "${tests[@]}" "$@"
