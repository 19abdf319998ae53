"""`agentrt sim serve`: the embedded engine served on loopback in wall-clock time."""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable

import anyio
import httpx
import pytest

import agentrt
from agentrt.sim import ServeError, serve, serve_async
from tests.sim._helpers import FAST, chat, small_config

pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn runs on asyncio


async def test_served_replicas_answer_agentrt_over_loopback() -> None:
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 2, "127.0.0.1", 0, "h100-8b")
        assert len(urls) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
        async with agentrt.Runtime(list(urls), dialect="vllm") as rt:
            async with rt.job("served") as job, job.session() as s:
                for _ in range(2):
                    await s.chat(
                        model="m",
                        messages=[{"role": "user", "content": "x " * 200}],
                        max_tokens=4,
                    )
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(urls[0].removesuffix("/v1") + "/metrics")).text
        tg.cancel_scope.cancel()
    assert job.report.status == "ok" and job.report.calls == 2
    assert (job.report.call_reports[1].cached_tokens or 0) > 0
    assert "vllm:prefix_cache_hits" in metrics


async def test_front_door_v1_spreads_requests_round_robin() -> None:
    """``/v1`` serves the whole cluster: each request goes to the next replica in turn;
    ``/replica-<i>/v1`` still reaches one replica; ``GET /`` lists both."""
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 2, "127.0.0.1", 0, small_config(cost=FAST))
        origin = urls.url.removesuffix("/v1")
        assert urls.url.startswith("http://127.0.0.1:") and urls.url.endswith("/v1")
        assert list(urls) == [f"{origin}/replica-0/v1", f"{origin}/replica-1/v1"]
        lines = urls.lines()
        assert len(lines) == 4 and lines[0].startswith(urls.url) and "round-robin" in lines[0]
        assert lines[1].startswith(urls[0]) and lines[3] == "model: sim-test"
        assert urls.model == "sim-test" and max(map(len, lines)) <= 78  # 80 cols, indented
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(4):
                await chat(http, urls.url, "hello there", max_tokens=2)
            await chat(http, urls[1], "hello there", max_tokens=2)
            models = (await http.get(urls.url + "/models")).json()
            listing = (await http.get(origin + "/")).json()
            front_metrics = await http.get(origin + "/metrics")
            per_replica = [
                _finished((await http.get(u.removesuffix("/v1") + "/metrics")).text) for u in urls
            ]
            missing = await http.get(origin + "/nowhere")
        tg.cancel_scope.cancel()
    assert per_replica == [2, 3]  # 4 through /v1, alternating; 1 straight to replica 1
    assert models["data"][0]["id"] == "sim-test"
    assert listing == {
        "openai": "/v1",
        "balancing": "round-robin per request",
        "replicas": ["/replica-0/v1", "/replica-1/v1"],
    }
    assert front_metrics.status_code == 404 and "/replica-1/metrics" in front_metrics.text
    assert missing.status_code == 404 and "/v1" in missing.json()["error"]["message"]


async def test_front_door_with_one_replica_is_that_replica() -> None:
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, small_config(cost=FAST))
        origin = urls.url.removesuffix("/v1")
        async with agentrt.Runtime([urls.url], dialect="vllm") as rt:
            async with rt.job("front") as job, job.session() as s:
                for _ in range(2):
                    await s.chat(
                        model="sim-test",
                        messages=[{"role": "user", "content": "x " * 200}],
                        max_tokens=4,
                    )
        async with httpx.AsyncClient(timeout=10) as http:
            metrics = (await http.get(origin + "/metrics")).text
            replica = (await http.get(urls[0].removesuffix("/v1") + "/metrics")).text
        tg.cancel_scope.cancel()
    assert job.report.status == "ok" and job.report.calls == 2
    assert (job.report.call_reports[1].cached_tokens or 0) > 0  # one engine, its cache
    assert _finished(metrics) == _finished(replica) == 2


async def test_front_door_sends_a_tool_start_notice_to_the_replica_with_the_session() -> None:
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 3, "127.0.0.1", 0, small_config(cost=FAST))
        async with httpx.AsyncClient(timeout=10) as http:
            await chat(http, urls[2], "a prompt", session_id="s-1")
            notice = {"v": 2, "session_id": "s-1", "expected_s": 1.0}
            known = await http.post(urls.url + "/agentrt/idle", json=notice)
            unknown = await http.post(
                urls.url + "/agentrt/idle", json={**notice, "session_id": "nobody"}
            )
            bad = await http.post(urls.url + "/agentrt/idle", json={"v": 1})
            counted = [
                _sample((await http.get(u.removesuffix("/v1") + "/metrics")).text, "idle_notices")
                for u in urls
            ]
        tg.cancel_scope.cancel()
    assert known.status_code == 204
    assert unknown.status_code == 404 and "nobody" in unknown.text
    assert bad.status_code == 400
    assert counted == [0, 0, 1]


async def test_a_port_in_use_is_a_one_line_serve_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServeError) as info:
            await serve_async(1, "127.0.0.1", port, small_config())
    message = str(info.value)
    assert message == f"port {port} on 127.0.0.1 is in use; pick another with --port"
    assert isinstance(info.value, RuntimeError) and info.value.__cause__ is None


def test_serve_raises_the_port_error_before_starting_anything() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is in use"):
            serve(1, "127.0.0.1", port, small_config())


def _sample(text: str, name: str) -> float:
    """The value of the first sample whose name contains ``name``."""
    for line in text.splitlines():
        if not line.startswith("#") and name in line.split("{")[0]:
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"no {name} in the metrics")


def _finished(text: str) -> int:
    return int(_sample(text, "vllm:request_success_total"))


async def test_replies_carry_the_server_timing_of_the_call() -> None:
    """``Server-Timing``: the app's time on the call (engine included) and the engine's,
    so a client can tell its own share of a latency from the server's."""
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, small_config(cost=FAST))
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            start = anyio.current_time()
            r = await http.post(urls.url + "/chat/completions", json={**body, "max_tokens": 50})
            latency_ms = (anyio.current_time() - start) * 1e3
        tg.cancel_scope.cancel()
    timing = {
        name.strip(): float(dur)
        for name, _, dur in (p.partition(";dur=") for p in r.headers["server-timing"].split(","))
    }
    assert set(timing) == {"app", "ttft", "engine"}
    # 50 decode steps of at least 1 ms each (FAST), all inside the app's share
    assert 50 <= timing["engine"] <= timing["app"] <= latency_ms
    assert timing["ttft"] < timing["engine"]


async def test_front_door_behind_a_gateway_routes_as_the_peer() -> None:
    """``gateway=``: ``/v1`` is the modelled router (here vllm-router's
    sticky_least_loaded: a session stays on one replica until ``/finish_session``)."""
    async with anyio.create_task_group() as tg:
        urls = await tg.start(
            functools.partial(
                serve_async,
                2,
                "127.0.0.1",
                0,
                small_config(cost=FAST),
                gateway="vllm-router:sticky_least_loaded",
            )
        )
        origin = urls.url.removesuffix("/v1")
        lines = urls.lines()
        assert "gateway: vllm-router:sticky_least_loaded" in "\n".join(lines)
        assert max(map(len, lines)) <= 78
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(3):
                r = await http.post(
                    urls.url + "/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                    headers={"x-session-id": "s-1"},
                )
                assert r.status_code == 200
            done = await http.post(origin + "/finish_session", params={"session_id": "s-1"})
            listing = (await http.get(origin + "/")).json()
            per_replica = [
                _finished((await http.get(u.removesuffix("/v1") + "/metrics")).text) for u in urls
            ]
        tg.cancel_scope.cancel()
    assert done.status_code == 200 and done.json()["session_id"] == "s-1"
    assert listing["balancing"] == "gateway vllm-router:sticky_least_loaded"
    assert sorted(per_replica) == [0, 3]  # one replica served the whole session


async def _until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll ``condition`` (state read off the runtime: nothing to wait on) until it holds."""
    with anyio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_served_replicas_publish_their_kv_events_over_zmq() -> None:
    # vLLM's --kv-events-config, reproduced: replica i publishes on PORT+i and lists the
    # address at /replica-i/kv_event_sources; Endpoint(kv_events="auto") finds and reads it.
    pytest.importorskip("zmq")
    pytest.importorskip("msgspec")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        events_port = s.getsockname()[1]
    async with anyio.create_task_group() as tg:
        urls = await tg.start(
            functools.partial(serve_async, kv_events_port=events_port), 2, "127.0.0.1", 0
        )
        async with httpx.AsyncClient() as http:
            listed = (await http.get(urls[1].removesuffix("/v1") + "/kv_event_sources")).json()
        assert listed[0]["endpoint"] == f"tcp://127.0.0.1:{events_port + 1}"
        endpoints = [agentrt.Endpoint(u, kv_events="auto") for u in urls]
        async with agentrt.Runtime(endpoints, dialect="vllm") as rt:
            shadows = [e.working_set for e in rt._core.endpoints]
            await _until(lambda: all(f.subscribed for f in rt._upkeep.feeds))
            await anyio.sleep(1.0)  # ZMQ joins the subscriptions a moment later
            async with rt.job("served") as job, job.session() as sess:
                for _ in range(2):
                    await sess.chat(
                        model="m",
                        messages=[{"role": "user", "content": "<|b:kv:0:20:16|>"}],
                        max_tokens=4,
                    )
                await _until(lambda: any(s.cached_tokens() for s in shadows))
                (shadow,) = [s for s in shadows if s.contexts()]
                (sid,) = shadow.contexts()
                assert shadow.cached_tokens() == 20 * 16
                assert shadow.exact is not None and shadow.exact.resident(sid) == 20 * 16
        tg.cancel_scope.cancel()
