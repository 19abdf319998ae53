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
.venv/bin/python -m pip install -q -e ".[dev,otel,prometheus,report,serve,test-frameworks]"

# The real engine (vLLM CPU + a tiny offline model) in its own environment.
bash scripts/engine_setup.sh

# Headless Chromium for the tests marked browser (the HTML report). CI runs this as root.
if ! command -v chromium >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq chromium >/dev/null
fi

.venv/bin/ruff check agentrt tests examples benchmarks scripts
.venv/bin/ruff format --check agentrt tests examples benchmarks scripts
.venv/bin/mypy

run_pytest() {
    set +e
    "$@"
    local rc=$?
    set -e
    if [[ $rc -eq 5 ]]; then
        echo "pytest collected no tests: that is a failure" >&2
        exit 1
    elif [[ $rc -ne 0 ]]; then
        exit $rc
    fi
}

run_pytest .venv/bin/python -m pytest "$@"

# agentrt supports openai 2.x (on httpx) as well as the current 3.x (on httpx2): the unit
# tests run again against the newest 2.x. The LlamaIndex adapter's tests run here too
# (LlamaIndex's OpenAI LLM requires openai<3).
if [[ $# -eq 0 ]]; then
    if [[ ! -x .venv-openai2/bin/python ]]; then
        "$PY" -m venv .venv-openai2
    fi
    .venv-openai2/bin/python -m pip install -q -e ".[dev,report,serve,test-llamaindex]" "openai>=2,<3"
    echo "--- unit tests with $(.venv-openai2/bin/python -m pip show openai | grep ^Version)"
    run_pytest .venv-openai2/bin/python -m pytest -m "not engine" -p no:cacheprovider
fi
