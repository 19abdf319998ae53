"""The HTTP surface: openai client, streaming through the in-process transport, errors,
cancellation, several replicas, and serving on loopback. Runs on asyncio (wall clock) and
on trio (virtual time)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anyio
import httpx
import openai
import pytest

import agentrt.sim
from agentrt.sim import Cluster, count_tokens, prompt_for_blocks, serve_async
from tests.sim._helpers import FAST, cached, chat, chat_body, small_config

pytestmark = pytest.mark.anyio


async def test_openai_client_chat_stream_and_completions() -> None:
    async with Cluster(2, small_config()) as cluster:
        http = httpx.AsyncClient(transport=cluster.transport())
        client = openai.AsyncOpenAI(base_url=cluster.base_urls[1], api_key="x", http_client=http)  # type: ignore[arg-type,unused-ignore]
        prompt = prompt_for_blocks(range(8), 64)
        r = await client.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": prompt}], max_tokens=7
        )
        assert r.model == "anything"
        assert r.choices[0].finish_reason == "length"
        assert count_tokens(r.choices[0].message.content or "") == 7
        assert r.usage is not None and r.usage.prompt_tokens == 512
        assert r.usage.completion_tokens == 7

        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        text = ""
        usage = None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            else:
                usage = chunk.usage
        assert count_tokens(text) == 5
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 512 - 16

        c = await client.completions.create(model="m", prompt="Say hello", max_tokens=3)
        assert count_tokens(c.choices[0].text) == 3 and c.usage is not None
        assert c.usage.prompt_tokens == count_tokens("Say hello")
        cs = await client.completions.create(model="m", prompt=[1, 2, 3], max_tokens=2, stream=True)
        assert "".join([x.choices[0].text async for x in cs]) == agentrt.sim.output_text(2)

        models = await client.models.list()
        assert [m.id for m in models.data] == ["sim-test"]
        assert cluster.replicas[1].stats().requests_finished == 4
        assert cluster.replicas[0].stats().requests_received == 0
        await http.aclose()


async def test_streaming_delivers_chunks_as_they_are_produced(anyio_backend: Any) -> None:
    # wall clock (asyncio): 50 ms steps, so a busy machine does not merge chunks
    slow = small_config(cost=dataclasses.replace(FAST, step_s=0.05))
    async with (
        Cluster(1, slow) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        url = cluster.base_urls[0]
        engine = cluster.replicas[0].engine
        body = chat_body("hello", max_tokens=6, stream=True)
        arrivals: list[tuple[float, int, int]] = []  # time, tokens out so far, running
        t0 = anyio.current_time()
        async with http.stream("POST", url + "/chat/completions", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    doc = json.loads(line[6:])
                    if doc["choices"][0]["delta"].get("content"):
                        arrivals.append(
                            (
                                anyio.current_time(),
                                engine.stats().generation_tokens,
                                len(engine.running),
                            )
                        )
        assert len(arrivals) == 6
        # each chunk arrives while the request still runs, right after its token
        assert [a[1] for a in arrivals] == [1, 2, 3, 4, 5, 6]
        assert all(a[2] == 1 for a in arrivals[:-1])
        times = [a[0] - t0 for a in arrivals]
        assert times == sorted(times)
        assert times[-1] - times[0] >= 5 * 0.05  # spread over the steps, not at the end


async def test_stream_interval_groups_tokens() -> None:
    async with (
        Cluster(1, small_config(stream_interval=4)) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        body = chat_body("hello", max_tokens=10, stream=True)
        sizes = []
        async with http.stream("POST", cluster.base_urls[0] + "/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    content = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    if content:
                        sizes.append(count_tokens(content))
        assert sizes == [1, 4, 4, 1]  # the first token at once, then every 4, then the rest


async def test_request_id_session_and_headers() -> None:
    async with (
        Cluster(1, small_config()) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        url = cluster.base_urls[0]
        r = await http.post(
            url + "/chat/completions",
            json=chat_body("hi", session_id="s1"),
            headers={"X-Request-Id": "call-42"},
        )
        assert r.status_code == 200
        assert r.json()["id"] == "chatcmpl-call-42"
        assert r.headers["x-request-id"] == "call-42"
        assert r.json()["usage"]["completion_tokens"] == 16  # default max_tokens
        assert (await http.get(url.replace("/v1", "/health"))).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "invalid JSON"),
        (json.dumps({"model": "m"}).encode(), 400, "messages"),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(),
            400,
            "max_tokens",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}], "priority": 3}).encode(),
            400,
            "priority",
        ),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), 400, "n=1"),
        (
            json.dumps(
                {"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 10}
            ).encode(),
            400,
            "maximum context length",
        ),
    ],
)
async def test_bad_requests(body: bytes, status: int, message: str) -> None:
    async with (
        Cluster(1, small_config(max_model_len=512)) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        r = await http.post(cluster.base_urls[0] + "/chat/completions", content=body)
        assert r.status_code == status
        assert message in r.json()["error"]["message"]


async def test_routing_errors() -> None:
    async with (
        Cluster(1, small_config()) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        url = cluster.base_urls[0]
        assert (await http.get(url + "/nope")).status_code == 404
        assert (await http.get(url + "/chat/completions")).status_code == 405
        with pytest.raises(httpx.ConnectError, match="no simulated replica"):
            await http.get("http://replica-9.sim/v1/models")
        with pytest.raises(openai.BadRequestError):
            client = openai.AsyncOpenAI(base_url=url, api_key="x", http_client=http, max_retries=0)  # type: ignore[arg-type,unused-ignore]
            await client.chat.completions.create(model="m", messages=[], max_tokens=1)
    with pytest.raises(RuntimeError, match="not running"):
        await httpx.AsyncClient(transport=cluster.transport()).get(url + "/models")


async def test_closing_a_stream_aborts_the_request() -> None:
    async with (
        Cluster(1, small_config()) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        engine = cluster.replicas[0].engine
        body = chat_body("hi", max_tokens=5000, stream=True)
        async with http.stream("POST", cluster.base_urls[0] + "/chat/completions", json=body) as r:
            async for _ in r.aiter_lines():
                break
        await anyio.sleep(0.5)  # the abort lands at the engine's next step
        st = engine.stats()
        assert st.requests_aborted == 1
        assert st.running == 0 and st.kv_usage == 0 and st.generation_tokens < 5000
        # a cancelled non-streaming call is aborted too
        with anyio.move_on_after(0.05):
            await chat(http, cluster.base_urls[0], "hi", max_tokens=5000)
        await anyio.sleep(0.5)
        assert engine.stats().requests_aborted == 2
        assert engine.stats().running == 0


async def test_cached_tokens_reported_per_replica() -> None:
    async with (
        Cluster(2, small_config()) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        a, b = cluster.base_urls
        p = prompt_for_blocks(range(6), 64)
        assert cached(await chat(http, a, p)) == 0
        assert cached(await chat(http, b, p)) == 0  # another replica, another cache
        assert cached(await chat(http, a, p)) == 6 * 64 - 16
        assert [s.requests_finished for s in cluster.stats()] == [2, 1]


async def test_cluster_owns_its_tasks() -> None:
    cluster = Cluster(3, small_config())
    assert len(set(cluster.base_urls)) == 3
    async with cluster:
        assert all(r.engine.started for r in cluster.replicas)
    assert not any(r.engine.started for r in cluster.replicas)
    with pytest.raises(RuntimeError, match="only once"):
        async with cluster:
            pass
    with pytest.raises(ValueError, match="preset"):
        Cluster(1, "h200-70b")
    with pytest.raises(KeyError, match="boom"):  # the body's error, not a group
        async with Cluster(1, small_config()):
            raise KeyError("boom")
    # an app whose engine does not run answers 503
    reply = await cluster.replicas[0].app.respond("POST", "/v1/chat/completions", [], b"{}")  # type: ignore[attr-defined]
    assert reply.status == 503


async def test_serve_on_loopback(anyio_backend: Any) -> None:
    if anyio_backend != "asyncio":
        with pytest.raises(RuntimeError, match="asyncio"):
            await serve_async(1, port=0, preset=small_config())
        return
    async with anyio.create_task_group() as tg:
        urls = await tg.start(
            lambda task_status: serve_async(
                2, "127.0.0.1", 0, small_config(cost=FAST), task_status=task_status
            )
        )
        assert len(urls) == 2 and urls[1].endswith("/replica-1/v1")
        async with httpx.AsyncClient(timeout=10) as http:
            client = openai.AsyncOpenAI(base_url=urls[1], api_key="x", http_client=http)  # type: ignore[arg-type,unused-ignore]
            r = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=3
            )
            assert count_tokens(r.choices[0].message.content or "") == 3
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=3,
                stream=True,
            )
            assert len([c async for c in stream]) == 4  # role + 3 tokens
            metrics = await http.get(urls[1].replace("/v1", "/metrics"))
            assert "vllm:generation_tokens_total" in metrics.text
            root = await http.get(urls[0].split("/replica-0")[0] + "/")
            assert root.json()["replicas"] == ["/replica-0/v1", "/replica-1/v1"]
        tg.cancel_scope.cancel()


async def test_generic_asgi_apps_stream_through_the_transport() -> None:
    """Any ASGI app behind the transport runs in its own task and streams chunk by chunk
    (here the cluster's path-prefix app, which is not a replica app)."""
    from agentrt.sim._transport import ASGIDispatchTransport

    async with Cluster(2, small_config()) as cluster:
        transport = ASGIDispatchTransport({"all.sim": cluster.asgi_app()}, cluster._spawner)
        async with httpx.AsyncClient(transport=transport) as http:
            url = "http://all.sim/replica-1/v1"
            assert cached(await chat(http, url, prompt_for_blocks(range(4), 64))) == 0
            body = chat_body("hello", max_tokens=4, stream=True)
            seen: list[int] = []
            before = cluster.replicas[1].stats().generation_tokens
            async with http.stream("POST", url + "/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        seen.append(cluster.replicas[1].stats().generation_tokens - before)
            assert seen == [1, 1, 2, 3, 4]  # role chunk, then each token as it is produced
            # closing early cancels the app task and aborts the request
            body["max_tokens"] = 5000
            async with http.stream("POST", url + "/chat/completions", json=body) as r:
                async for _ in r.aiter_raw():
                    break
            await anyio.sleep(0.2)
            assert cluster.replicas[1].stats().requests_aborted == 1
            assert (await http.get("http://all.sim/")).json()["replicas"][0] == "/replica-0/v1"
            assert (await http.get("http://all.sim/replica-7/v1/models")).status_code == 404


async def test_error_replies_can_be_streamed_raw() -> None:
    async with (
        Cluster(1, small_config()) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        async with http.stream("POST", cluster.base_urls[0] + "/chat/completions", json={}) as r:
            raw = b"".join([c async for c in r.aiter_raw()])
        assert r.status_code == 400 and b"messages" in raw


async def test_a_served_name_list_answers_other_models_404_as_openai_does() -> None:
    """``served_model_names`` (what ``agentrt sim serve`` sets): another name is a 404 in
    OpenAI's shape (``model_not_found``), as vLLM and OpenAI answer; a served name, or
    none, is answered; ``/v1/models`` lists every served name."""
    config = small_config(model_name="sim-a", served_model_names=("sim-a", "alias-b"))
    async with Cluster(1, config) as cluster:
        http = httpx.AsyncClient(transport=cluster.transport())
        url = cluster.base_urls[0]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        wrong = await http.post(f"{url}/chat/completions", json={**body, "model": "gpt-4o"})
        assert wrong.status_code == 404
        assert wrong.json() == {
            "error": {
                "message": "The model `gpt-4o` does not exist. Served: sim-a, alias-b",
                "type": "invalid_request_error",
                "param": None,
                "code": "model_not_found",
            }
        }
        text = await http.post(f"{url}/completions", json={"model": "x", "prompt": "hi"})
        assert text.status_code == 404
        for name in ("sim-a", "alias-b"):
            ok = await http.post(f"{url}/chat/completions", json={**body, "model": name})
            assert ok.status_code == 200 and ok.json()["model"] == name
        listed = (await http.get(f"{url}/models")).json()["data"]
        assert [m["id"] for m in listed] == ["sim-a", "alias-b"]
        client = openai.AsyncOpenAI(base_url=url, api_key="x", http_client=http)  # type: ignore[arg-type,unused-ignore]
        with pytest.raises(openai.NotFoundError, match=r"does not exist\. Served: sim-a"):
            await client.chat.completions.create(model="nope", **body)
    with pytest.raises(ValueError, match="served_model_names"):
        small_config(served_model_names=())
    with pytest.raises(ValueError, match="model_name"):
        small_config(model_name="a", served_model_names=("b",))
