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
# The distribution was called agentrt before 0.2.0 (now agentjct): an old install's files
# would shadow the new one's `agentrt` command, so it goes first.
.venv/bin/python -m pip uninstall -q -y agentrt 2>/dev/null || true
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev,otel,prometheus,report,serve,ray,test-frameworks]"

# The real engine (vLLM CPU + a tiny offline model) in its own environment.
bash scripts/engine_setup.sh

# Headless Chromium for the tests marked browser (the HTML report). CI runs this as root.
if ! command -v chromium >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq chromium >/dev/null
fi

# The docs site's tools (mkdocs, mkdocstrings; griffe for tests/test_docs_site.py).
.venv/bin/python -m pip install -q -e ".[docs]"

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
    .venv-openai2/bin/python -m pip uninstall -q -y agentrt 2>/dev/null || true
    .venv-openai2/bin/python -m pip install -q -e ".[dev,report,serve,test-llamaindex]" "openai>=2,<3"
    echo "--- unit tests with $(.venv-openai2/bin/python -m pip show openai | grep ^Version)"
    run_pytest .venv-openai2/bin/python -m pytest -m "not engine" -p no:cacheprovider
fi

# The agent frameworks (issue 36): each supported framework at its pinned version and at
# its newest release, each in a virtual environment of its own (PyPI only; uv resolves).
if [[ $# -eq 0 ]]; then
    echo "--- frameworks: pinned and newest releases (scripts/test_frameworks.sh)"
    PYTHON="$PY" bash scripts/test_frameworks.sh
fi

# Packaging: build the sdist and the wheel (from the sdist), check them, install the wheel
# (not editable) into a fresh virtual environment and run `agentrt demo` from a folder
# outside the repo, so that a file missing from the wheel fails here.
PKG="$(mktemp -d)"
trap 'rm -rf "$PKG"' EXIT
echo "--- packaging: build, twine check, agentrt demo from the installed wheel"
.venv/bin/python -m build --outdir "$PKG/dist" . >"$PKG/build.log" 2>&1 || { cat "$PKG/build.log"; exit 1; }
.venv/bin/python -m twine check --strict "$PKG"/dist/*
"$PY" -m venv "$PKG/venv"
"$PKG/venv/bin/python" -m pip install -q "$PKG"/dist/*.whl
(cd "$PKG" && env -u PYTHONPATH "$PKG/venv/bin/agentrt" demo --out "$PKG/demo" --no-plots >"$PKG/demo.log" 2>&1) \
    || { cat "$PKG/demo.log"; exit 1; }
tail -n 3 "$PKG/demo.log"

# The docs site: a broken link or anchor, or a warning of mkdocstrings, fails the build
# (tests/test_docs_site.py fails on a public name without a docstring).
echo "--- docs: mkdocs build --strict"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$PKG/site"
