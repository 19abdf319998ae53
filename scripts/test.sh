#!/usr/bin/env bash
# Installs everything the tests need, from scratch where missing, and runs them:
# lint, types, unit tests, and the integration tests against the real vLLM CPU engine.
#
#   bash scripts/test.sh              # everything
#   bash scripts/test.sh -m "not engine"   # extra arguments go to pytest
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev,report]"

# The real engine (vLLM CPU + a tiny offline model) in its own environment.
bash scripts/engine_setup.sh

.venv/bin/ruff check agentrt tests examples benchmarks scripts
.venv/bin/ruff format --check agentrt tests examples benchmarks scripts
.venv/bin/mypy

set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
    echo "pytest collected no tests: that is a failure" >&2
    exit 1
fi
exit $rc
