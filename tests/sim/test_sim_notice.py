"""The tool-start notice (protocol v2): ``POST {base}/agentrt/idle`` on a replica, through
the in-process transport and through the ASGI app, and the ``x-agentrt-accept``
advertisement. Runs on asyncio (wall clock) and on trio (virtual time)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from agentrt.sim import Cluster, prompt_for_blocks
from agentrt.sim._transport import ASGIDispatchTransport
from tests.sim._helpers import chat, chat_body, small_config

pytestmark = pytest.mark.anyio


def notice(session: str = "s", expected: Any = 30.0, **changes: Any) -> dict[str, Any]:
    body = {
        "v": 2,
        "session_id": session,
        "job_id": "j",
        "tool": "search",
        "expected_s": expected,
        "source": "declared",
    }
    body.update(changes)
    return body


async def check_route(http: httpx.AsyncClient, url: str) -> None:
    """204, 400, 404 and 405 on ``url + /agentrt/idle``; the session ``s`` has had a call."""
    r = await http.post(url + "/agentrt/idle", json=notice())
    assert r.status_code == 204 and r.content == b""
    assert (await http.post(url + "/agentrt/idle", json=notice(expected=None))).status_code == 204
    r = await http.post(url + "/agentrt/idle", json=notice("nobody"))
    assert r.status_code == 404 and "'nobody'" in r.json()["error"]["message"]
    bad: list[tuple[Any, str]] = [
        (notice(expected=-1), "expected_s"),
        (notice(expected="soon"), "expected_s"),
        (notice(expected=True), "expected_s"),
        (notice(source="guessed"), "source"),
        (notice(session_id=""), "session_id"),
        (notice(session_id=7), "session_id"),
        (notice(v=1), "'v'"),
        (notice(tool=3), "tool"),
        ([1, 2], "JSON object"),
    ]
    for body, word in bad:
        r = await http.post(url + "/agentrt/idle", json=body)
        assert r.status_code == 400, body
        assert word in r.json()["error"]["message"]
    r = await http.post(url + "/agentrt/idle", content=b"{nope", headers={"content-type": "json"})
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]
    assert (await http.get(url + "/agentrt/idle")).status_code == 405


async def test_notice_route_in_process_and_advertisement() -> None:
    async with (
        Cluster(1, small_config()) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        url = cluster.base_urls[0]
        r = await http.post(
            url + "/chat/completions",
            json=chat_body("hi", session_id="s", max_tokens=2),
        )
        assert "idle-notice" in r.headers["x-agentrt-accept"].split(",")
        body = chat_body("hi", max_tokens=2, stream=True)
        async with http.stream("POST", url + "/chat/completions", json=body) as s:
            assert s.headers["x-agentrt-accept"] == "idle-notice"
            await s.aread()
        await check_route(http, url)
        assert cluster.replicas[0].stats().idle_notices == 2


async def test_notice_route_through_the_asgi_app() -> None:
    async with Cluster(2, small_config()) as cluster:
        transport = ASGIDispatchTransport({"all.sim": cluster.asgi_app()}, cluster._spawner)
        async with httpx.AsyncClient(transport=transport) as http:
            url = "http://all.sim/replica-1/v1"
            await chat(http, url, "hi", 2, session_id="s")
            await check_route(http, url)
            # replica 0 never saw the session
            r = await http.post("http://all.sim/replica-0/v1/agentrt/idle", json=notice())
            assert r.status_code == 404


async def test_a_notice_applies_the_tool_wait_policy() -> None:
    """A call without a declared wait leaves the KV to LRU; the notice then pins it
    (``pin``) or offloads it with a prefetch (``offload``)."""
    for policy, host in (("pin", 0), ("offload", 400)):
        cfg = small_config(num_gpu_blocks=200, num_host_blocks=host, tool_wait_policy=policy)
        async with (
            Cluster(1, cfg) as cluster,
            httpx.AsyncClient(transport=cluster.transport()) as http,
        ):
            url = cluster.base_urls[0]
            engine = cluster.replicas[0].engine
            await chat(http, url, prompt_for_blocks(range(15), 64), 8, session_id="s")
            assert engine.kv.used == 0
            r = await http.post(url + "/agentrt/idle", json=notice(expected=5.0))
            assert r.status_code == 204
            await anyio.sleep(0.01)  # the engine loop applies it
            st = engine.stats()
            if policy == "pin":
                assert st.tool_waits_pinned == 1 and engine.kv.used == 60
            else:
                assert st.tool_waits_offloaded == 1 and st.host_blocks_used == 60
            engine.kv.check()
