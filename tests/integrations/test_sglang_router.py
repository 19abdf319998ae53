"""The ``sglang`` dialect through SGLang's real router: a session sticks to one worker.

SGLang's router (PyPI ``sglang-router`` 0.3.2, the Model Gateway; installed into
``.engine/sglang-router`` by ``scripts/engine_setup.sh``) runs the ``manual`` policy in
front of the two replicas of an embedded simulator: a request's ``X-SMG-Routing-Key``
is pinned to the worker its first request went to (a random one), and a request without
a key goes to a random worker. With the ``sglang`` dialect (the key is the session id)
every session's calls land on one replica; with agentrt's own header only, a session's
calls are spread over both (docs/protocol.md, ``sglang``). The 0.3.2 command line offers
``random``, ``round_robin``, ``cache_aware``, ``power_of_two`` and ``manual``; the
``consistent_hashing`` policy that keys on the same header is not among them.

Marked ``engine``: it needs what ``scripts/engine_setup.sh`` installs (see _gateway.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integrations import _gateway as gw

pytestmark = [pytest.mark.engine, pytest.mark.anyio, pytest.mark.timeout(gw.READY_TIMEOUT_S + 120)]

SGLANG_ROUTER_VERSION = "0.3.2"
"""The version scripts/engine_setup.sh installs (AGENTRT_SGLANG_ROUTER_VERSION)."""


def _wait_for_workers(base: str, count: int) -> None:
    """The router answers /health before its workers are registered (asynchronously)."""
    deadline = time.monotonic() + gw.READY_TIMEOUT_S
    workers: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        workers = httpx.get(f"{base}/workers", timeout=5.0).json().get("workers", [])
        if len(workers) == count and all(w.get("is_healthy") for w in workers):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the router registered {workers} after {gw.READY_TIMEOUT_S:.0f} s")


@pytest.fixture(scope="module")
def sglang_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = gw.find_installed("sglang-router", "python", SGLANG_ROUTER_VERSION)
    folder = tmp_path_factory.mktemp("sglang-router")
    with gw.sim_replicas(folder) as origin:
        port = gw.free_port()
        base = f"http://127.0.0.1:{port}"
        command = [str(python), "-m", "sglang_router.launch_router", "--worker-urls"]
        command += [f"{origin}/replica-0", f"{origin}/replica-1"]
        command += ["--policy=manual", "--host=127.0.0.1", f"--port={port}"]
        # Its metrics listener defaults to port 29000: one of its own, free.
        command += ["--prometheus-host=127.0.0.1", f"--prometheus-port={gw.free_port()}"]
        with gw.running(
            command, folder / "router.log", f"{base}/health", "SGLang's router", gw.clean_env()
        ):
            _wait_for_workers(base, 2)
            yield f"{base}/v1"


async def test_each_session_sticks_to_one_worker(sglang_router: str) -> None:
    # sglang:session-id: the body session_id passes through the router as well.
    seen = await gw.replicas_by_session(sglang_router, "sglang:session-id")
    assert gw.sticky(seen), seen


async def test_without_the_routing_key_sessions_are_spread(sglang_router: str) -> None:
    """The control: with agentrt's own header only, each call goes to a random worker;
    all six sessions stay on one of two by chance with probability 8^-6."""
    seen = await gw.replicas_by_session(sglang_router, "generic")
    assert not gw.sticky(seen), seen
