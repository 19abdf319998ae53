"""The ``litellm`` dialect through LiteLLM's real proxy: a session sticks to one deployment.

LiteLLM's proxy (PyPI ``litellm`` 1.110.2, installed into ``.engine/litellm`` by
``scripts/engine_setup.sh``) serves one model group over two deployments, the two replicas
of an embedded simulator, with the router's ``session_affinity`` pre-call check on and the
``simple-shuffle`` strategy. With the ``litellm`` dialect (``x-litellm-session-id``) every
session's calls land on one replica; with agentrt's own header only, the proxy spreads a
session's calls over both (docs/protocol.md, ``litellm``).

Marked ``engine``: it needs what ``scripts/engine_setup.sh`` installs (see _gateway.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integrations import _gateway as gw

pytestmark = [pytest.mark.engine, pytest.mark.anyio, pytest.mark.timeout(gw.READY_TIMEOUT_S + 120)]

LITELLM_VERSION = "1.110.2"
"""The version scripts/engine_setup.sh installs (AGENTRT_LITELLM_VERSION)."""


@dataclass(frozen=True)
class Proxy:
    url: str
    key: str


@pytest.fixture(scope="module")
def litellm_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    binary = gw.find_installed("litellm", "litellm", LITELLM_VERSION)
    folder = tmp_path_factory.mktemp("litellm")
    with gw.sim_replicas(folder) as origin:
        deployments = "".join(
            f"  - model_name: m\n    litellm_params:\n      model: openai/m\n"
            f"      api_base: {origin}/replica-{i}/v1\n      api_key: none\n"
            for i in range(2)
        )
        config = folder / "config.yaml"
        config.write_text(
            "model_list:\n"
            + deployments
            + "router_settings:\n  routing_strategy: simple-shuffle\n"
            + '  optional_pre_call_checks: ["session_affinity"]\n'
        )
        key = "sk-agentrt-test-" + secrets.token_hex(16)
        port = gw.free_port()
        base = f"http://127.0.0.1:{port}"
        command = [str(binary), f"--config={config}", "--host=127.0.0.1", f"--port={port}"]
        env = gw.clean_env(
            LITELLM_MASTER_KEY=key,
            LITELLM_LOCAL_MODEL_COST_MAP="True",  # no network
            LITELLM_TELEMETRY="False",
        )
        # One worker: the session pins live in its memory.
        with gw.running(
            [*command, "--num_workers=1"],
            folder / "litellm.log",
            f"{base}/health/liveliness",
            "LiteLLM's proxy",
            env,
        ):
            yield Proxy(url=f"{base}/v1", key=key)


async def test_each_session_sticks_to_one_deployment(litellm_proxy: Proxy) -> None:
    seen = await gw.replicas_by_session(litellm_proxy.url, "litellm", api_key=litellm_proxy.key)
    assert gw.sticky(seen), seen


async def test_a_generic_session_header_sticks_too(litellm_proxy: Proxy) -> None:
    """LiteLLM 1.110 also reads a bare ``x-session-id`` (sent by opencode) when its value
    is 8 or more letters, digits, '_' or '-' (``get_chain_id_from_headers``): the generic
    ``session-header`` dialect works through it as well."""
    seen = await gw.replicas_by_session(
        litellm_proxy.url, "session-header:x-session-id", api_key=litellm_proxy.key
    )
    assert gw.sticky(seen), seen


async def test_without_the_header_sessions_are_spread(litellm_proxy: Proxy) -> None:
    """The control: the same proxy and load with agentrt's own header only. A session
    stays on one of two replicas by chance with probability 1/8 (3 shuffles after its
    first call); all six do with probability 8^-6."""
    seen = await gw.replicas_by_session(litellm_proxy.url, "generic", api_key=litellm_proxy.key)
    assert not gw.sticky(seen), seen
