#!/usr/bin/env bash
# Installs everything the tests need, from scratch where missing, and runs them.
#
#   bash scripts/test.sh                  # everything (CI runs this): lint, types, the unit and
#                                         # integration tests, the tests against the real vLLM
#                                         # CPU engine (set up here: its own Python 3.11), the
#                                         # openai 2.x / LlamaIndex pass, packaging, the docs
#   bash scripts/test.sh --quick          # no engine: lint, types and every test not marked
#                                         # engine, on any Python >= 3.11; no engine, Ray or
#                                         # docs tools installed
#   bash scripts/test.sh [--quick] ARGS   # ARGS go to every pytest pass (e.g. -k routing, -x,
#                                         # tests/runtime/test_runtime.py); no stage is skipped for them
#
# Environment: PYTHON (the interpreter of .venv, default python3), AGENTRT_ENGINE_PYTHON (the
# engine's, default python3.11; see scripts/engine_setup.sh).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

MODE=full
PYTEST_ARGS=()
for arg in "$@"; do
    case "$arg" in
        --quick) MODE=quick ;;
        --full) MODE=full ;;
        *) PYTEST_ARGS+=("$arg") ;;
    esac
done
STARTED=$SECONDS
stage() { echo "--- [$MODE] $*"; }

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "scripts/test.sh: agentrt needs Python >= 3.11; $PY is $("$PY" --version 2>&1 || echo missing) (set PYTHON)" >&2
    exit 1
fi
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
stage "install agentrt and its test tools into .venv ($(.venv/bin/python --version))"
# The distribution was called agentrt before 0.2.0 (now agentjct): an old install's files
# would shadow the new one's `agentrt` command, so it goes first.
.venv/bin/python -m pip uninstall -q -y agentrt 2>/dev/null || true
.venv/bin/python -m pip install -q --upgrade pip
if [[ $MODE == quick ]]; then
    # The frameworks too (pure Python): mypy --strict checks the adapters against them.
    .venv/bin/python -m pip install -q -e ".[dev,otel,prometheus,report,serve,kv-events,test-frameworks]"
else
    .venv/bin/python -m pip install -q -e ".[dev,otel,prometheus,report,serve,kv-events,ray,test-frameworks]"

    # The real engine (vLLM CPU + a tiny offline model) in its own environment, with its own
    # Python 3.11 (found, or installed with uv where uv is; else one line says what to do).
    stage "engine setup (scripts/engine_setup.sh)"
    bash scripts/engine_setup.sh

    # Headless Chromium for the tests marked browser (the HTML report). CI runs this as root.
    if ! command -v chromium >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq chromium >/dev/null
    fi

    # The docs site's tools (mkdocs, mkdocstrings; griffe for tests/test_docs_site.py).
    .venv/bin/python -m pip install -q -e ".[docs]"
fi

stage "ruff, mypy --strict"
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

if [[ $MODE == quick ]]; then
    stage "pytest -m 'not engine' ${PYTEST_ARGS[*]}"
    run_pytest .venv/bin/python -m pytest -m "not engine" "${PYTEST_ARGS[@]}"
    echo "--- [quick] passed in $((SECONDS - STARTED)) s. Not run in quick mode: the engine tests," \
        "the openai 2.x / LlamaIndex pass, scripts/test_frameworks.sh, packaging and the docs build" \
        "(bash scripts/test.sh runs them all)"
    exit 0
fi

stage "pytest ${PYTEST_ARGS[*]}"
run_pytest .venv/bin/python -m pytest "${PYTEST_ARGS[@]}"

# agentrt supports openai 2.x (on httpx) as well as the current 3.x (on httpx2): the unit
# tests run again against the newest 2.x. The LlamaIndex adapter's tests run here too
# (LlamaIndex's OpenAI LLM requires openai<3). The arguments given go here as well.
if [[ ! -x .venv-openai2/bin/python ]]; then
    "$PY" -m venv .venv-openai2
fi
.venv-openai2/bin/python -m pip uninstall -q -y agentrt 2>/dev/null || true
.venv-openai2/bin/python -m pip install -q -e ".[dev,report,serve,test-llamaindex]" "openai>=2,<3"
stage "unit tests with $(.venv-openai2/bin/python -m pip show openai | grep ^Version)"
run_pytest .venv-openai2/bin/python -m pytest -m "not engine" -p no:cacheprovider "${PYTEST_ARGS[@]}"

# --- Stage: the agent frameworks, each supported framework at its pinned version and at
# its newest release, each in a virtual environment of its own (PyPI only; uv resolves),
# in full mode only. Its arguments are framework names, not pytest's: it runs them all.
stage "framework adapters, pinned and newest releases (scripts/test_frameworks.sh)"
PYTHON="$PY" bash scripts/test_frameworks.sh

# Packaging: build the sdist and the wheel (from the sdist), check them, install the wheel
# (not editable) into a fresh virtual environment and run `agentrt demo` from a folder
# outside the repo, so that a file missing from the wheel fails here.
PKG="$(mktemp -d)"
trap 'rm -rf "$PKG"' EXIT
stage "packaging: build, twine check, agentrt demo and the Claude Code sample from the installed wheel"
.venv/bin/python -m build --outdir "$PKG/dist" . >"$PKG/build.log" 2>&1 || { cat "$PKG/build.log"; exit 1; }
.venv/bin/python -m twine check --strict "$PKG"/dist/*
"$PY" -m venv "$PKG/venv"
"$PKG/venv/bin/python" -m pip install -q "$PKG"/dist/*.whl
(cd "$PKG" && env -u PYTHONPATH "$PKG/venv/bin/agentrt" demo --out "$PKG/demo" --no-plots >"$PKG/demo.log" 2>&1) \
    || { cat "$PKG/demo.log"; exit 1; }
tail -n 3 "$PKG/demo.log"
# The Claude Code workload on the sample the wheel ships (no traces folder anywhere).
(cd "$PKG" && env -u PYTHONPATH -u AGENTRT_TRACES XDG_CACHE_HOME="$PKG/cache" "$PKG/venv/bin/agentrt" \
    bench --workload claude-code --jobs 3 --token-scale 0.25 --no-stretch --workers 1 \
    --out "$PKG/cc" --no-plots >"$PKG/cc.log" 2>&1) || { cat "$PKG/cc.log"; exit 1; }
grep -q "calls per client" "$PKG/cc.log" || { cat "$PKG/cc.log"; exit 1; }

# The docs site: a broken link or anchor, or a warning of mkdocstrings, fails the build
# (tests/test_docs_site.py fails on a public name without a docstring).
stage "docs: mkdocs build --strict"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$PKG/site"
