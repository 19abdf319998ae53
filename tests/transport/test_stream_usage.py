"""Streamed calls are counted: prompt, completion and cached tokens reach the CallReport
and the job's totals whether or not the caller asked for usage in the stream, and the
caller reads the stream the server would have sent it.

Wire-format tests (httpx.MockTransport): a server that streams as OpenAI's does (with
``stream_options.include_usage``, ``"usage":null`` on every chunk and a last chunk with
``"choices": []`` and the usage; without it, neither), in pieces of any size."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

import agentrt
from agentrt._transport._stream import UsageFilter

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"
USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 3,
    "total_tokens": 123,
    "prompt_tokens_details": {"cached_tokens": 96},
}
WORDS = ("Hel", "lo", ' "usage":null, {"choices":[]}')
"""The last piece's text looks like the members agentrt removes: it must arrive as is."""
MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def sse(
    body: dict[str, Any], *, newline: str = "\n", spaced: bool = False, vllm: bool = False
) -> bytes:
    """What an OpenAI-style server streams for ``body``; ``vllm``: as vLLM does, no
    ``"usage": null`` members, and its ``system_fingerprint`` on the last content chunk
    when not asked for usage, on the usage chunk when asked."""
    chat = "messages" in body
    options = body.get("stream_options") or {}
    with_usage = bool(options.get("include_usage"))
    seps = (", ", ": ") if spaced else (",", ":")

    def event(obj: dict[str, Any]) -> str:
        return f"data: {json.dumps(obj, separators=seps)}{newline}{newline}"

    def chunk(piece: dict[str, Any]) -> str:
        obj: dict[str, Any] = {
            "id": "c-1",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, **piece}],
        }
        if with_usage and not vllm:
            obj["usage"] = None
        if vllm and not with_usage and piece.get("finish_reason"):
            obj["system_fingerprint"] = "vllm-fp"
        return event(obj)

    out = []
    for i, word in enumerate(WORDS):
        last = i == len(WORDS) - 1
        if chat:
            delta = {"content": word} if i else {"role": "assistant", "content": word}
            out.append(chunk({"delta": delta, "finish_reason": "stop" if last else None}))
        else:
            out.append(chunk({"text": word, "finish_reason": "length" if last else None}))
    if with_usage:
        kind = "chat.completion.chunk" if chat else "text_completion"
        out.append(
            event(
                {
                    "id": "c-1",
                    "object": kind,
                    "created": 1,
                    "model": "m",
                    "choices": [],
                    "usage": USAGE,
                    **({"system_fingerprint": "vllm-fp"} if vllm else {}),
                }
            )
        )
    out.append(f"data: [DONE]{newline}{newline}")
    return "".join(out).encode()


@dataclass
class Server:
    """Streams :func:`sse` in pieces of ``piece`` bytes (``whole``: a reply built from
    ``content=``, which httpx reads before the caller sees it); records what it received."""

    piece: int = 7
    whole: bool = False
    newline: str = "\n"
    spaced: bool = False
    vllm: bool = False
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[httpx.Headers] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        self.headers.append(request.headers)
        if not body.get("stream"):
            return httpx.Response(
                200,
                json={
                    "id": "c-1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "Hello"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": USAGE,
                },
            )
        data = sse(body, newline=self.newline, spaced=self.spaced, vllm=self.vllm)
        if self.whole:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)
        parts = [data[i : i + self.piece] for i in range(0, len(data), self.piece)]
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Pieces(parts)
        )


class Pieces(httpx.AsyncByteStream):
    """A reply's body in pieces, as a network read returns it (no generator: a client
    that stops at ``[DONE]`` leaves nothing unfinished)."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = iter(parts)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            return next(self.parts)
        except StopIteration:
            raise StopAsyncIteration from None


def plain_client(server: Server) -> openai.AsyncOpenAI:
    """openai's own client on the same server, without agentrt."""
    http = httpx.AsyncClient(transport=server.transport())
    return openai.AsyncOpenAI(base_url=URL, api_key="k", http_client=http)


def counted(report: agentrt.JobReport) -> None:
    """Every call of the job reported the server's usage, and the totals add them up."""
    assert report.calls >= 1
    for call in report.call_reports:
        assert call.stream
        assert call.prompt_tokens == USAGE["prompt_tokens"]
        assert call.completion_tokens == USAGE["completion_tokens"]
        assert call.cached_tokens == 96
    assert report.prompt_tokens == USAGE["prompt_tokens"] * report.calls
    assert report.completion_tokens == USAGE["completion_tokens"] * report.calls
    assert report.cached_tokens == 96 * report.calls


@pytest.mark.parametrize(
    ("options", "sent"),
    [
        (None, {"include_usage": True}),
        ({"include_usage": False}, {"include_usage": True}),
        ({"include_obfuscation": False}, {"include_obfuscation": False, "include_usage": True}),
        ({"include_usage": True}, {"include_usage": True}),
    ],
)
async def test_a_stream_asks_for_usage_where_the_caller_did_not(
    options: dict[str, Any] | None, sent: dict[str, Any]
) -> None:
    server = Server()
    extra: dict[str, Any] = {} if options is None else {"stream_options": options}
    async with agentrt.Runtime([URL], transport=server.transport()) as rt:
        async with rt.job("j") as job, job.session("s") as s:
            stream = await s.chat(model="m", messages=MSG, stream=True, **extra)
            async for _ in stream:
                pass
            await s.chat(model="m", messages=MSG)  # not streamed: nothing added
    streamed, plain = server.bodies
    assert streamed["stream_options"] == sent
    asked_by_agentrt = not (options or {}).get("include_usage")
    # The rest of the body is the caller's, and the stream is read uncompressed only
    # where agentrt must remove the usage chunk from it.
    assert {k: v for k, v in streamed.items() if k != "stream_options"} == {
        "model": "m",
        "messages": MSG,
        "stream": True,
    }
    identity = server.headers[0]["accept-encoding"] == "identity"
    assert identity == asked_by_agentrt
    assert "stream_options" not in plain and "stream" not in plain
    assert server.headers[1]["accept-encoding"] != "identity"
    counted_calls = [c for c in job.report.call_reports if c.stream]
    assert len(counted_calls) == 1 and counted_calls[0].prompt_tokens == 120


@pytest.mark.parametrize("piece", [1, 7, 100_000])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize("vllm", [False, True], ids=["openai", "vllm"])
async def test_the_caller_reads_the_bytes_the_server_sends_unasked(
    piece: int, newline: str, path: str, vllm: bool
) -> None:
    server = Server(piece=piece, newline=newline, vllm=vllm)
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 3}
    body.update({"messages": MSG} if path == "/chat/completions" else {"prompt": "hi"})
    async with agentrt.Runtime([URL], transport=server.transport()) as rt:
        http = rt.http_client()
        async with rt.job("j") as job, job.session("s"):
            async with http.stream("POST", URL + path, json=body) as response:
                received = b"".join([b async for b in response.aiter_bytes()])
    assert server.bodies[0]["stream_options"] == {"include_usage": True}
    sent = sse(server.bodies[0], newline=newline, vllm=vllm)
    assert b'"usage"' in sent  # what the server sent had usage
    assert received == sse(body, newline=newline, vllm=vllm)  # the caller reads it unasked
    assert received != sent
    counted(job.report)


async def test_a_stream_whose_body_came_read_is_observed_whole() -> None:
    """``httpx.MockTransport`` with ``content=``: the reply's body is read before agentrt
    sees it, and its caller reads ``response.content``, never the stream. The call is
    still ``ok`` with its usage and time to first token (it was ``cancelled``, with
    neither), and the caller still reads the bytes the server sends unasked."""
    server = Server(whole=True)
    async with agentrt.Runtime([URL], transport=server.transport()) as rt:
        client = rt.openai()
        async with rt.job("j") as job, job.session("s"):
            stream = await client.chat.completions.create(model="m", messages=MSG, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            async with rt.http_client().stream(
                "POST",
                URL + "/chat/completions",
                json={"model": "m", "messages": MSG, "stream": True},
            ) as response:
                received = await response.aread()
    assert text == "".join(WORDS)
    assert received == sse({"messages": MSG, "stream": True})
    assert int(response.headers["content-length"]) == len(received)
    assert [(c.status, c.ttft_s is not None) for c in job.report.call_reports] == [("ok", True)] * 2
    counted(job.report)


async def test_json_dumps_spacing_is_removed_too() -> None:
    server = Server(spaced=True)
    async with agentrt.Runtime([URL], transport=server.transport()) as rt:
        body = {"model": "m", "messages": MSG, "stream": True}
        async with rt.job("j") as job, job.session("s"):
            async with rt.http_client().stream("POST", URL + "/chat/completions", json=body) as r:
                received = b"".join([b async for b in r.aiter_bytes()])
    assert received == sse(body, spaced=True)
    counted(job.report)


def dumps(chunks: list[Any]) -> list[tuple[dict[str, Any], set[str]]]:
    """Chunks as openai parsed them: their values and the fields the JSON set."""
    return [(c.model_dump(), set(c.model_fields_set)) for c in chunks]


async def test_openai_clients_see_the_chunks_openai_sees_alone() -> None:
    server = Server()
    plain = plain_client(server)
    alone = [
        c async for c in await plain.chat.completions.create(model="m", messages=MSG, stream=True)
    ]
    alone_text = [
        c async for c in await plain.completions.create(model="m", prompt="hi", stream=True)
    ]
    assert [c.usage for c in alone] == [None] * len(WORDS)
    async with agentrt.Runtime([URL], transport=server.transport()) as rt:
        client = rt.openai()
        async with rt.job("openai") as job, job.session("s") as s:
            via_client = [
                c
                async for c in await client.chat.completions.create(
                    model="m",
                    messages=MSG,
                    stream=True,
                )
            ]
            via_session = [c async for c in await s.chat(model="m", messages=MSG, stream=True)]
            via_complete = [c async for c in await s.complete(model="m", prompt="hi", stream=True)]
    assert dumps(via_client) == dumps(alone)
    assert dumps(via_session) == dumps(alone)
    assert dumps(via_complete) == dumps(alone_text)
    assert "".join(c.choices[0].delta.content or "" for c in via_session) == "".join(WORDS)
    counted(job.report)
    assert job.report.calls == 3


async def test_a_caller_who_asked_gets_the_usage_chunk() -> None:
    server = Server(piece=5)
    async with agentrt.Runtime([URL], transport=server.transport()) as rt:
        async with rt.job("j") as job, job.session("s") as s:
            stream = await s.chat(
                model="m",
                messages=MSG,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 120
    assert all(c.usage is None for c in chunks[:-1]) and len(chunks) == len(WORDS) + 1
    counted(job.report)


def test_a_sync_session_stream_is_counted() -> None:
    server = Server()
    with agentrt.SyncRuntime([URL], transport=server.transport()) as srt:
        with srt.job("sync") as job, job.session("s") as s:
            text = "".join(
                c.choices[0].delta.content or ""
                for c in s.chat(model="m", messages=MSG, stream=True)
            )
    assert text == "".join(WORDS)
    assert server.bodies[0]["stream_options"] == {"include_usage": True}
    counted(job.report)


class Chunks:
    """A stand-in for the observed stream under the filter: these byte chunks."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def __anext__(self) -> bytes:
        if not self.chunks:
            raise StopAsyncIteration
        return self.chunks.pop(0)


async def filtered(*chunks: bytes, choices: int = 1) -> list[bytes]:
    """What each read of the filter returns, over a stream of these byte chunks."""
    return [c async for c in UsageFilter(Chunks(*chunks), choices)]  # type: ignore[arg-type]


def data(obj: dict[str, Any], end: bytes = b"\n\n") -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + end


async def test_the_filter_keeps_everything_but_what_asking_added() -> None:
    content = 'say ,"usage":null, and "usage": null,'
    text = data({"choices": [{"delta": {"content": content}, "finish_reason": None}]})
    with_null = text[:-3] + b',"usage":null}\n\n'
    last = data({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    usage_only = data({"choices": [], "usage": USAGE, "system_fingerprint": "fp"}, b"\r\n\r\n")
    on_content = b"event: x\n" + data({"choices": [{"delta": {}}], "usage": USAGE})
    comment = b": a comment\n\n"
    done = b"data: [DONE]\n\n"
    # Content chunks pass at once, whole events only; the "usage": null members go, a
    # text that looks like them stays.
    assert await filtered(with_null[:9], with_null[9:] + text[:4], text[4:]) == [text, text]
    # The usage-only chunk goes, its separator too; its fingerprint moves onto the chunk
    # with the finish reason, which waits for it; a usage block on a content chunk goes
    # (asking put it there); anything else stays as it was.
    out = await filtered(text + last, usage_only + on_content + comment + done)
    fingerprinted = last[:-3] + b',"system_fingerprint":"fp"}\n\n'
    on_content_unasked = b"event: x\n" + data({"choices": [{"delta": {}}]})
    assert out == [text, fingerprinted + on_content_unasked + comment + done]
    assert json.loads(fingerprinted[6:])["system_fingerprint"] == "fp"
    # A chunk that has its fingerprint (OpenAI's all do) is not held.
    stamped = data({"choices": [{"delta": {}, "finish_reason": "stop"}], "system_fingerprint": "a"})
    assert await filtered(stamped, usage_only, done) == [stamped, done]
    # Without a usage chunk the held chunk comes with [DONE], or at the end.
    assert await filtered(last, done) == [last + done]
    assert await filtered(last, b"data: [DONE]") == [last + b"data: [DONE]"]


def pick(index: int, content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return data({"choices": [{"index": index, "delta": delta, "finish_reason": finish}]})


async def test_the_filter_holds_no_content_chunk_of_several_choices() -> None:
    usage_only = data({"choices": [], "usage": USAGE, "system_fingerprint": "fp"})
    done = b"data: [DONE]\n\n"
    a, b, c = pick(0, "a"), pick(1, "b"), pick(1, "c")
    a_end, b_end = pick(0, None, "stop"), pick(1, None, "stop")
    # One read per chunk: every chunk comes at its read, the first choice's finish too;
    # only the chunk that finishes the last choice waits for the next event.
    out = await filtered(a, b, a_end, c, b_end, usage_only, done, choices=2)
    assert out == [a, b, a_end, c, b_end[:-3] + b',"system_fingerprint":"fp"}\n\n', done]
    # A reply with more choices than the request said: a finish chunk waits for the
    # next event at most.
    assert await filtered(a_end, c, b_end, done) == [a_end + c, b_end + done]


@pytest.mark.parametrize(
    "chunk",
    [
        '{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":%s}',
        '{"usage": %s, "id": "c", "choices": [{"delta": {}, "finish_reason": "stop"}]}',
        '{"id":"c" , "usage" : %s ,"choices":[{"delta":{"content":"\\"usage\\": 1"},'
        '"finish_reason":"stop"}]}',
    ],
    ids=["last", "first-spaced", "middle-odd-text"],
)
async def test_the_filter_removes_usage_from_a_content_chunk(chunk: str) -> None:
    usage = json.dumps(USAGE)
    sent = f"data: {chunk % usage}\n\n".encode()
    unasked = json.loads(chunk % usage)
    del unasked["usage"]
    (event,) = await filtered(sent)
    assert json.loads(event[6:]) == unasked
    assert event.endswith(b"}\n\n")
    assert b"usage" not in event.replace(b'\\"usage\\"', b"")  # the text's stays
    # The other bytes stay as sent: the member and one comma are all that goes.
    assert len(sent) - len(event) <= len(usage) + len('"usage": ,  ')


async def test_the_filter_reencodes_a_chunk_it_cannot_cut() -> None:
    sent = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],\ndata: "usage":{}}\n\n'
    (out,) = await filtered(sent)
    assert out == b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
