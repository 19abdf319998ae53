#!/usr/bin/env bash
# The agent frameworks agentrt supports, each in a virtual environment of its own, twice:
# at the version pinned in pyproject.toml (extra test-<framework>) and at its newest
# release, so that a framework's release that breaks agentrt is seen the week it ships
# (the pinned run is skipped while the pinned version is the newest).
# Each environment runs that framework's integration tests (its example against
# `agentrt sim serve` on loopback). Needs nothing from the internet but PyPI; uses uv
# (installed from PyPI into the first environment) to resolve in seconds.
#
#   bash scripts/test_frameworks.sh                 # every framework, pinned and newest
#   bash scripts/test_frameworks.sh agno strands    # only these
#
# The pinned LangChain, LlamaIndex and OpenAI Agents SDK run in scripts/test.sh; here
# they run at their newest releases only.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
export LITELLM_LOCAL_MODEL_COST_MAP=True AGNO_TELEMETRY=false CREWAI_DISABLE_TELEMETRY=true
export CREWAI_TRACING_ENABLED=false
PY="${PYTHON:-python3}"
VENVS="${AGENTRT_FRAMEWORK_VENVS:-$REPO/.venv-frameworks}"

if [[ ! -x "$VENVS/uv/bin/uv" ]]; then
    "$PY" -m venv "$VENVS/uv"
    "$VENVS/uv/bin/python" -m pip install -q uv
fi
UV="$VENVS/uv/bin/uv"

# framework -> the tests that cover it
declare -A TESTS=(
    [pydantic-ai]="tests/integrations/test_pydantic_ai.py tests/integrations/test_frameworks.py -k pydantic_ai"
    [agno]="tests/integrations/test_frameworks.py -k agno"
    [strands]="tests/integrations/test_strands.py tests/integrations/test_frameworks.py -k strands"
    [autogen]="tests/integrations/test_frameworks.py -k autogen"
    [ag2]="tests/integrations/test_ag2.py tests/integrations/test_frameworks.py -k ag2"
    [google-adk]="tests/integrations/test_google_adk.py tests/integrations/test_frameworks.py -k google_adk"
    [smolagents]="tests/integrations/test_frameworks.py -k smolagents"
    [crewai]="tests/integrations/test_frameworks.py -k crewai"
    [langchain]="tests/integrations/test_langchain.py tests/integrations/test_langchain_stream_usage.py"
    [openai-agents]="tests/integrations/test_openai_agents.py"
    [llamaindex]="tests/integrations/test_llamaindex.py"
)
# framework -> its distribution, whose version names the run
declare -A DIST=(
    [pydantic-ai]=pydantic-ai-slim [agno]=agno [strands]=strands-agents
    [autogen]=autogen-agentchat [ag2]=ag2 [google-adk]=google-adk [smolagents]=smolagents
    [crewai]=crewai [langchain]=langchain [openai-agents]=openai-agents
    [llamaindex]=llama-index-core
)
PINNED_HERE="pydantic-ai agno strands autogen ag2 google-adk smolagents crewai"
if [[ $# -gt 0 ]]; then
    FRAMEWORKS="$*"
else
    FRAMEWORKS="$PINNED_HERE langchain openai-agents llamaindex"
fi

failed=()
version() { "$UV" pip show -p "$1" "$2" 2>/dev/null | sed -n 's/^Version: //p'; }
for fw in $FRAMEWORKS; do
    [[ -n "${TESTS[$fw]:-}" ]] || { echo "unknown framework: $fw" >&2; exit 2; }
    kinds="newest"
    [[ " $PINNED_HERE " == *" $fw "* ]] && kinds="newest pinned"
    newest=""
    for kind in $kinds; do
        venv="$VENVS/$fw-$kind"
        [[ -x "$venv/bin/python" ]] || "$UV" venv -q -p "$PY" "$venv"
        if [[ $kind == pinned ]]; then
            "$UV" pip install -q -p "$venv" -e ".[dev,serve,test-$fw]"
        else
            "$UV" pip install -q -p "$venv" --upgrade -e ".[dev,serve,$fw]"
        fi
        got="$(version "$venv" "${DIST[$fw]}")"
        echo "--- $fw ($kind): ${DIST[$fw]} $got, openai $(version "$venv" openai)"
        if [[ $kind == pinned && "$got" == "$newest" ]]; then
            echo "    the pinned version is the newest: tested above"
            continue
        fi
        [[ $kind == newest ]] && newest="$got"
        # shellcheck disable=SC2086
        if ! "$venv/bin/python" -m pytest ${TESTS[$fw]} -q -p no:cacheprovider -m "not engine"; then
            failed+=("$fw ($kind, ${DIST[$fw]} $got)")
        fi
    done
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "framework tests failed: ${failed[*]}" >&2
    exit 1
fi
echo "framework tests passed: $FRAMEWORKS"
