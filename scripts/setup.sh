#!/usr/bin/env bash
# Set up a virtual environment in .venv with traceml_nb installed (editable).
#   bash scripts/setup.sh          # the package and what the demo needs
#   bash scripts/setup.sh --test   # plus the test tools, Debian's chromium (browser tests) and
#                                  # Debian's postgresql (the server store's tests)
# TORCH_SPEC overrides the torch that is installed when none is present (default: the CPU
# build torch==2.13.0, installed first so that no multi-GB CUDA build is pulled in).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
extras="demo"
if [[ "${1:-}" == "--test" ]]; then extras="demo,test"; fi

if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
if [[ "$extras" == *test* ]]; then
  # fastai for tests/integration/test_fastai.py, without its torchvision and spacy (its vision
  # and text parts, which the tests do not use): torchvision would replace the CPU torch with
  # the build it pins. Its other requirements first, then fastai alone, so pip finds no
  # requirement of it missing while it resolves the others.
  .venv/bin/python -m pip install --quiet "fastcore>=2.2.22" "fasttransform>=0.0.3" \
      "fastprogress>=0.2.4" "fastdownload>=0.0.8,<2" "plum-dispatch<2.10" matplotlib \
      scikit-learn scipy pyyaml cloudpickle
  .venv/bin/python -m pip install --quiet --no-deps "fastai==2.8.12"
fi
# An editable install leaves the package uncompiled; where PYTHONDONTWRITEBYTECODE is set (CI
# images, some notebook hosts) every process that imports it would compile it again (~0.15 s).
compiled=(traceml_nb)
if [[ "$extras" == *test* ]]; then compiled+=(tests benchmarks); fi
.venv/bin/python -m compileall -q "${compiled[@]}"
# the kernel that notebooks and tests run in is this venv's python
.venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (traceml_nb)" >/dev/null

if [[ "$extras" == *test* && ! -x /usr/bin/chromium ]]; then
  if [[ "$(id -u)" == 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "note: /usr/bin/chromium is missing and this is not root: browser tests will be skipped" >&2
  fi
fi
if [[ "$extras" == *test* ]] && ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [[ "$(id -u)" == 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "note: PostgreSQL (initdb) is missing and this is not root: the server store's tests will be skipped" >&2
  fi
fi
echo "traceml_nb is set up in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
