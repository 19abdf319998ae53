"""Small conventions users bring from openai-python and httpx: ``OPENAI_API_KEY`` when the
runtime has no key, ``timeout_s`` as an ``httpx.Timeout``, ``Retry-After`` as an HTTP
date, and SSE streams with ``data:[DONE]`` and bare-CR line ends."""

from __future__ import annotations

import email.utils
import importlib
import json
import time
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import openai
import pytest

from agentrt import EndpointError, Retry, Runtime
from agentrt._transport._retry import retry_after
from tests._fake import MSG, FakeEngine
from tests.faults._faultserver import Fault, fault_server
from tests.transport.test_stream_usage import USAGE, WORDS, Pieces, sse

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"
ENV_KEY = "sk-env-0123456789"


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# -- OPENAI_API_KEY ---------------------------------------------------------------------


async def authorization_sent(rt: Runtime, engine: FakeEngine, **client: Any) -> str | None:
    async with rt:
        await rt.openai(**client).chat.completions.create(model="m", messages=MSG)
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)  # the runtime's own client
    first, second = (seen.headers.get("authorization") for seen in engine.seen)
    assert first == second
    return first


async def test_a_runtime_without_a_key_sends_openai_api_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    engine = FakeEngine()
    rt = Runtime([URL], transport=engine.transport(), dialect="openai")
    assert await authorization_sent(rt, engine) == f"Bearer {ENV_KEY}"


@pytest.mark.parametrize(
    ("runtime_key", "client_key", "sent"),
    [
        ("sk-runtime", None, "Bearer sk-runtime"),  # the runtime's key first
        (None, "sk-client", "Bearer sk-client"),  # then the client's own
    ],
)
async def test_a_key_given_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, runtime_key: str | None, client_key: str | None, sent: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    engine = FakeEngine()
    rt = Runtime([URL], transport=engine.transport(), api_key=runtime_key)
    client = {"api_key": client_key} if client_key else {}
    if client_key:  # the runtime's own client has no such key: count the first call only
        async with rt:
            await rt.openai(**client).chat.completions.create(model="m", messages=MSG)
        assert engine.seen[0].headers.get("authorization") == sent
    else:
        assert await authorization_sent(rt, engine) == sent


async def test_keyless_local_servers_still_get_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    engine = FakeEngine()
    rt = Runtime([URL], transport=engine.transport())
    assert await authorization_sent(rt, engine) is None  # not even the placeholder


async def test_an_unusable_openai_api_key_fails_before_any_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY + "\n")
    engine = FakeEngine()
    with pytest.raises(ValueError, match="OPENAI_API_KEY contains CR/LF") as caught:
        async with Runtime([URL], transport=engine.transport()):
            pass
    assert ENV_KEY not in str(caught.value)
    assert engine.seen == []


# -- timeout_s ----------------------------------------------------------------------------


# httpx2 comes with openai 3; with openai 2 only httpx is there.
LIBS = [httpx, *(m for m in [_optional("httpx2")] if m is not None)]


@pytest.mark.parametrize("lib", LIBS, ids=[m.__name__ for m in LIBS])
@pytest.mark.parametrize("transport_lib", LIBS, ids=[f"on-{m.__name__}" for m in LIBS])
async def test_timeout_s_takes_either_librarys_timeout(lib: Any, transport_lib: Any) -> None:
    transport = transport_lib.MockTransport(lambda r: transport_lib.Response(200, json={}))
    rt = Runtime([URL], transport=transport, timeout_s=lib.Timeout(7.0, connect=1.5, pool=None))
    async with rt:
        timeout = rt.http_client().timeout
        assert isinstance(timeout, transport_lib.Timeout)  # the runtime's own library's
        assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (
            1.5,
            7.0,
            7.0,
            None,
        )


async def test_a_number_is_the_read_timeout_with_10_s_to_connect() -> None:
    async with Runtime([URL], transport=FakeEngine().transport(), timeout_s=30) as rt:
        timeout = rt.http_client().timeout
        assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (10, 30, 30, 30)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (httpx.Timeout(5.0, read=-1.0), "read timeout must be a finite number > 0 or None"),
        (httpx.Timeout(5.0, connect=float("inf")), "connect timeout must be a finite"),
        (0, "timeout_s must be a finite number > 0"),
        ("10", "timeout_s must be a number of seconds or an httpx.Timeout"),
        (True, "timeout_s must be a number of seconds or an httpx.Timeout"),
    ],
)
def test_bad_timeouts_are_refused_at_once(value: Any, error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        Runtime([URL], timeout_s=value)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_timeout_object_bounds_each_attempt_on_the_wire() -> None:
    """A server that never answers: each attempt ends at the Timeout's read limit."""
    retry = Retry(attempts=2, wait_initial=0.0, wait_jitter=0.0)
    with fault_server(Fault.stall(30.0)) as server:
        rt = Runtime([server.url], retry=retry, timeout_s=httpx.Timeout(0.3, connect=2.0))
        t0 = time.monotonic()
        async with rt, rt.job("j") as job, job.session() as s:
            with pytest.raises(EndpointError, match="ReadTimeout"):
                await s.chat(model="m", messages=MSG)
        assert time.monotonic() - t0 < 10.0  # two attempts of 0.3 s, not two of 600
        assert len(server.chat_requests) == 2


# -- Retry-After ------------------------------------------------------------------------


NOW = datetime(2026, 10, 21, 7, 28, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "Wed, 21 Oct 2026 07:28:30 GMT"}, 30.0),  # IMF-fixdate
        ({"retry-after": "Wednesday, 21-Oct-26 07:29:00 GMT"}, 60.0),  # RFC 850 (obsolete)
        ({"retry-after": "Wed Oct 21 07:28:05 2026"}, 5.0),  # asctime
        ({"retry-after": "Wed, 21 Oct 2026 07:27:00 GMT"}, 0.0),  # past: no wait
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "1.5", "retry-after-ms": "250"}, 0.25),  # OpenAI's first
        ({"retry-after": "soon"}, None),
        ({"retry-after": "Wed, 99 Oct 2026 07:28:30 GMT"}, None),
        ({}, None),
    ],
)
def test_retry_after_reads_seconds_and_http_dates(
    headers: dict[str, str], wait: float | None
) -> None:
    assert retry_after(httpx.Headers(headers), now=NOW) == wait


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_retry_after_date_is_waited_for() -> None:
    retry = Retry(attempts=2, wait_initial=0.01, wait_max=0.01, wait_jitter=0.0)
    with fault_server() as server:
        # Whole seconds: 3 s ahead now is 2 to 3 s ahead when the reply is read.
        when = email.utils.formatdate(time.time() + 3, usegmt=True)
        server.push(Fault.status(429, retry_after=when))
        async with Runtime([server.url], retry=retry) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
        first, second = server.chat_requests
    assert second.at - first.at >= 1.5  # the date's wait, not the 10 ms backoff
    assert job.report.call_reports[0].attempts == 2


# -- SSE line ends and data:[DONE] -------------------------------------------------------


def odd_sse(body: dict[str, Any], newline: str, spaced: bool) -> bytes:
    data = sse(body, newline=newline)
    return data if spaced else data.replace(b"data: ", b"data:")


class OddServer:
    """Streams :func:`odd_sse` in pieces of ``piece`` bytes, then ``trailer``."""

    def __init__(self, newline: str, spaced: bool, piece: int, trailer: bytes = b"") -> None:
        self.newline, self.spaced, self.piece, self.trailer = newline, spaced, piece, trailer

    def transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            data = odd_sse(json.loads(request.content), self.newline, self.spaced)
            parts = [data[i : i + self.piece] for i in range(0, len(data), self.piece)]
            if self.trailer:
                parts.append(self.trailer)
            headers = {"content-type": "text/event-stream"}
            return httpx.Response(200, headers=headers, stream=Pieces(parts))

        return httpx.MockTransport(handle)


@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n"], ids=["CR", "CRLF", "LF"])
@pytest.mark.parametrize("spaced", [False, True], ids=["data:", "data: "])
@pytest.mark.parametrize("piece", [1, 7])
@pytest.mark.parametrize("asked", [False, True], ids=["agentrt-asks-usage", "caller-asks"])
async def test_odd_streams_are_read_and_counted(
    newline: str, spaced: bool, piece: int, asked: bool
) -> None:
    server = OddServer(newline, spaced, piece)
    options: Any = {"include_usage": True} if asked else openai.NOT_GIVEN
    async with Runtime([URL], transport=server.transport()) as rt:
        async with rt.job("j") as job, job.session() as s:
            stream = await s.chat(model="m", messages=MSG, stream=True, stream_options=options)
            chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(WORDS)
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == (1 if asked else 0)  # agentrt's own ask stays hidden
    (call,) = job.report.call_reports
    assert call.status == "ok", call.error
    assert (call.prompt_tokens, call.completion_tokens) == (
        USAGE["prompt_tokens"],
        USAGE["completion_tokens"],
    )


@pytest.mark.parametrize("newline", ["\r", "\n"], ids=["CR", "LF"])
async def test_done_without_a_space_completes_the_call(newline: str) -> None:
    """A caller that stops reading once ``data:[DONE]`` arrives (the server still has a
    comment to send) ended a complete call, not a cancelled one."""
    server = OddServer(newline, spaced=False, piece=16, trailer=f": bye{newline * 2}".encode())
    async with Runtime([URL], transport=server.transport()) as rt:
        async with rt.job("j") as job, job.session():
            client = rt.http_client()
            body = {"model": "m", "messages": MSG, "stream": True}
            async with client.stream("POST", URL + "/chat/completions", json=body) as response:
                seen = b""
                async for part in response.aiter_raw():
                    seen += part
                    if b"[DONE]" + newline.encode() in seen:
                        break
    (call,) = job.report.call_reports
    assert (call.status, call.error) == ("ok", None)
    assert call.prompt_tokens == USAGE["prompt_tokens"]


class Stalling(Pieces):
    """Pieces, then nothing ever again (the connection stays open)."""

    async def __anext__(self) -> bytes:
        try:
            return next(self.parts)
        except StopIteration:
            await anyio.sleep_forever()
            raise AssertionError("unreachable") from None


async def test_the_bench_drivers_raw_reader_stops_at_done_without_a_space() -> None:
    from agentrt.bench._drivers import _http_chat

    def handle(request: httpx.Request) -> httpx.Response:
        data = odd_sse({"messages": MSG, "stream": True}, "\n", spaced=False)
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=Stalling([data]))

    body = {"model": "m", "messages": MSG, "stream": True}
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        with anyio.fail_after(10):  # it used to wait for the end of the stream
            result = await _http_chat(http, URL, body, True)
    assert result.ttft_s is not None
