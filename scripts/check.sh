#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (after scripts/setup.sh --test).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check traceml_nb tests benchmarks
.venv/bin/ruff format --check traceml_nb tests benchmarks
.venv/bin/mypy traceml_nb
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
