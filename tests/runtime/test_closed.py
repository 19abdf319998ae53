"""Closing means closed: after a runtime's block ends, every client it built refuses new
calls with the error ``rt.job`` raises, before anything is sent, counted or journaled.
Against the embedded engine (in-process), on asyncio and trio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import agentrt
from agentrt import AgentrtError, Runtime, RuntimeClosedError, SyncRuntime
from agentrt.integrations import Bridge
from agentrt.sim import Cluster
from agentrt.telemetry import Event, JobEnded, read_journal
from tests._fake import MSG
from tests.sim._helpers import small_config

pytestmark = pytest.mark.anyio


def received(cluster: Cluster) -> int:
    return sum(s.requests_received for s in cluster.stats())


def closed_message() -> str:
    """What ``rt.job`` says once its runtime is closed."""
    rt = Runtime(["http://x.test/v1"], otel=False)
    rt._opened = rt._closed = True
    with pytest.raises(RuntimeClosedError) as info:
        rt._check_open()
    return str(info.value)


async def test_clients_refuse_calls_after_the_block_like_rt_job(tmp_path: Path) -> None:
    events: list[Event] = []
    journal = tmp_path / "runs.jsonl"
    async with Cluster(1, small_config()) as cluster:
        url = cluster.base_urls[0]
        async with Runtime(
            [url], transport=cluster.transport(), hooks=[events.append], journal=journal
        ) as rt:
            client = rt.openai()
            http = rt.http_client()
            reply = await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
            assert reply.choices[0].message.content  # it worked while open
        assert "closed" in repr(rt)
        before_events, before_requests = len(events), received(cluster)
        assert before_requests == 1 and len(read_journal(journal)) == 1

        with pytest.raises(RuntimeClosedError) as by_job:
            async with rt.job("late"):
                pass
        with pytest.raises(RuntimeClosedError) as by_openai:
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
        with pytest.raises(RuntimeClosedError) as by_stream:
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=2, stream=True)
        with pytest.raises(RuntimeClosedError) as by_completion:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        with pytest.raises(RuntimeClosedError) as by_http:
            await http.post(f"{url}/chat/completions", json={"model": "m", "messages": MSG})
        # A request to no endpoint of the runtime's is refused too: the client is closed.
        with pytest.raises(RuntimeClosedError):
            await http.get("http://elsewhere.test/")
        with pytest.raises(RuntimeClosedError):
            rt.openai()
        with pytest.raises(RuntimeClosedError):
            rt.http_client()

    message = str(by_job.value)
    assert message == closed_message() and "closed" in message
    for info in (by_openai, by_stream, by_completion, by_http):
        # The same error as rt.job's, not openai's APIConnectionError around it.
        assert isinstance(info.value, AgentrtError)
        assert not isinstance(info.value, openai.APIConnectionError)
        assert str(info.value) == message
    # Nothing was sent, counted, emitted or journaled after the block.
    assert received(cluster) == before_requests
    assert len(events) == before_events
    assert len(read_journal(journal)) == 1
    assert len(rt.reports()) == 1


async def test_a_job_ending_after_close_is_not_journaled_and_warns_nothing(
    tmp_path: Path,
) -> None:
    """A framework's run that ends after the runtime closed (its job left open) still gets
    its report, but the closed journal is not written (no RuntimeWarning from the hook)."""
    journal = tmp_path / "runs.jsonl"
    ended: list[str] = []

    def hook(event: Event) -> None:
        if isinstance(event, JobEnded):
            ended.append(event.report.name)

    async with Cluster(1, small_config()) as cluster:
        rt = Runtime(
            list(cluster.base_urls), transport=cluster.transport(), journal=journal, hooks=[hook]
        )
        bridge = Bridge(rt)
        with pytest.raises(AgentrtError, match="still running"):
            async with rt:
                async with rt.job("done"):
                    pass
                assert bridge.start_job("run-1", "late") is not None
        assert bridge.start_job("run-2", "later") is None  # a closed runtime starts none
        report = bridge.end_job("run-1")
    assert report is not None and report.status == "ok"
    assert ended == ["done", "late"]
    assert [r.name for r in read_journal(journal)] == ["done"]
    assert [r.name for r in rt.reports()] == ["done", "late"]


async def test_a_runtime_is_entered_once_and_says_where_it_is() -> None:
    rt = Runtime(["http://a.test/v1"], otel=False)
    assert repr(rt).endswith("not entered>")
    with pytest.raises(AgentrtError, match="inside 'async with Runtime"):
        rt.openai()
    async with rt:
        assert repr(rt).endswith(" open>")
    with pytest.raises(AgentrtError, match="entered only once"):
        async with rt:
            pass


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_clients_refuse_calls_after_the_block(backend: str, tmp_path: Path) -> None:
    journal = tmp_path / "runs.jsonl"
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            json={
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                    }
                ],
            },
        )

    srt = SyncRuntime(
        ["http://engine.test/v1"],
        backend=backend,  # type: ignore[arg-type]
        transport=httpx.MockTransport(handler),
        journal=journal,
    )
    assert repr(srt).startswith("<agentrt.SyncRuntime endpoints=['http://engine.test/v1']")
    assert f"backend={backend!r} not entered>" in repr(srt)
    with srt as rt:
        assert repr(rt).endswith(" open>")
        client = rt.openai()
        http = rt.http_client()
        with rt.job("j") as job, job.session() as s:
            client.chat.completions.create(model="m", messages=MSG)
            session = s
    assert repr(srt).endswith(" closed>")
    assert len(seen) == 1 and len(read_journal(journal)) == 1

    errors: list[BaseException] = []
    attempts: list[Any] = [
        lambda: client.chat.completions.create(model="m", messages=MSG),
        lambda: http.post("http://engine.test/v1/chat/completions", json={}),
        lambda: rt.openai(),
        lambda: rt.http_client(),
        lambda: rt.job("late").__enter__(),
        lambda: session.tool("grep").__enter__(),
    ]
    for attempt in attempts:
        with pytest.raises(RuntimeClosedError) as info:
            attempt()
        errors.append(info.value)
    assert {str(e) for e in errors} == {closed_message()}
    assert len(seen) == 1 and len(read_journal(journal)) == 1


def test_the_closed_error_is_public_and_an_agentrt_error() -> None:
    assert agentrt.RuntimeClosedError is RuntimeClosedError
    assert issubclass(RuntimeClosedError, AgentrtError)


async def test_closing_adds_one_attribute_read_per_call() -> None:
    """The transport's check is ``core.closed``: flipping that one attribute is what
    refuses calls (no other state is consulted on the hot path)."""
    async with Cluster(1, small_config()) as cluster:
        async with Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt:
            client = rt.openai()
            rt._core.closed = True
            with pytest.raises(RuntimeClosedError):
                await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
            rt._core.closed = False
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
        assert received(cluster) == 1
