"""The twin's thin paths (issue 26, item 4): in virtual time a plain client's calls go
straight to the replica's (or the gateway's) app and agentrt's requests straight to its
own transport, skipping the HTTP client above them. The CPU a replay costs changes; not
one decision may: the same jobs replay with the same per-call placement, timings, token
counts and cache hits as through the HTTP clients."""

from __future__ import annotations

from typing import Any

import pytest

import agentrt.bench._drivers as drivers
from agentrt.bench import BenchConfig, run_bench

CLIENTS = ("plain", "plain>llm-d", "agentrt:session", "agentrt:defaults", "agentrt:session>dynamo")


def _run(monkeypatch: pytest.MonkeyPatch | None) -> list[Any]:
    if monkeypatch is not None:  # no embedded transport is recognised: the HTTP clients
        monkeypatch.setattr(drivers, "ASGIDispatchTransport", type("Never", (), {}))
    cfg = BenchConfig(
        workload="coding",
        jobs=6,
        rate=0.5,
        replicas=3,
        clients=CLIENTS,
        stretch=False,
        api="http",
        seed=3,
    )
    result = run_bench(cfg)
    return [
        (c.client, c.failed, c.jct, c.call_latency, c.ttft, c.prefix_cache_hit_rate, c.replicas)
        for c in result.clients
    ]


def test_the_thin_paths_make_the_same_decisions_as_the_http_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    used = {"plain": 0, "agentrt": 0}
    inprocess, direct = drivers._inprocess_chat, drivers._Direct.chat

    async def spy_plain(*args: Any, **kwargs: Any) -> Any:
        used["plain"] += 1
        return await inprocess(*args, **kwargs)

    async def spy_agentrt(*args: Any, **kwargs: Any) -> Any:
        used["agentrt"] += 1
        return await direct(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(drivers, "_inprocess_chat", spy_plain)
        m.setattr(drivers._Direct, "chat", spy_agentrt)
        thin = _run(None)
    assert used["plain"] > 0 and used["agentrt"] > 0  # the thin paths ran
    with monkeypatch.context() as m:
        http = _run(m)
    assert [row[0] for row in thin] == ["plain", "plain>llm-d", *CLIENTS[2:]]
    assert all(row[1] == 0 for row in thin)  # every job ran
    assert any(row[4] for row in thin)  # streamed calls were among them (TTFT measured)
    assert thin == http


def test_a_plain_client_on_the_thin_path_still_fails_on_an_error_status() -> None:
    """An error reply raises as the HTTP client's ``raise_for_status`` does: the job
    fails with the same status text."""
    import anyio
    import httpx

    from agentrt.sim import PRESETS, Cluster

    async def main() -> str:
        async with Cluster(1, PRESETS["cpu-tiny"]) as cluster:
            transport = cluster.transport()
            found = transport.replica_app(cluster.base_urls[0])
            assert found is not None
            app, base = found
            body = {"model": "m", "messages": "not a list"}
            with pytest.raises(httpx.HTTPStatusError) as err:
                await drivers._inprocess_chat(app, base, body, False)
            return str(err.value)

    message = anyio.run(main)
    assert "404" in message or "400" in message
