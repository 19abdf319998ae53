"""The exact request a call puts on the wire: its headers (names, case and order) and its
body bytes, for a plain call, a streamed call whose caller did not ask for usage (agentrt
asks for it), the same toward a dialect that adds body fields, a retried attempt, and a
retry that moves from such a dialect's endpoint to one whose dialect adds none.

Pinned from agentrt as it was before the request body was serialized once per attempt
(issue 27): the bytes must not move. Ids are seeded (``agentrt._ids.seeded``), so that
each run sends the same ones. Wire-format unit tests: a MockTransport (of httpx, and of
httpx2 where installed) plays the server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrt import Endpoint, Retry, Runtime
from agentrt._ids import seeded
from tests._fake import HTTP_LIBS

pytestmark = pytest.mark.anyio

A = "http://a.test/v1"
B = "http://b.test/v1"
MSG = [{"role": "user", "content": "hi"}]
HEADERS = {"user-agent": "t", "content-type": "application/json", "x-caller": "c"}
REPLY = {
    "id": "r",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
CHUNKS = (
    b'data: {"id":"r","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"r","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)
Sent = tuple[str, list[tuple[bytes, bytes]], bytes]


async def _calls(
    lib: Any,
    endpoints: list[Any],
    body: dict[str, Any],
    *,
    dialect: str = "generic",
    fail: int = 0,
    error: bool = False,
    refuse: bool = False,
) -> list[Sent]:
    """What a job's one call sent (each attempt's URL, raw headers and body); the first
    ``fail`` requests are answered 503, or with a connect error (``error``), or with
    vLLM's refusal of a priority (``refuse``)."""
    sent: list[Sent] = []
    stream = body.get("stream") is True

    def handler(request: Any) -> Any:
        sent.append((str(request.url), list(request.headers.raw), request.read()))
        if len(sent) <= fail:
            if error:
                raise lib.ConnectError("refused", request=request)
            if refuse:
                message = "Got priority 0 but Priority scheduling is not enabled."
                return lib.Response(400, json={"error": {"message": message}})
            return lib.Response(503, json={"error": "busy"})
        if stream:
            return lib.Response(200, headers={"content-type": "text/event-stream"}, content=CHUNKS)
        return lib.Response(200, json=REPLY)

    retry = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)
    with seeded(27):
        async with (
            Runtime(
                endpoints,
                dialect=dialect,
                transport=lib.MockTransport(handler),
                retry=retry,
                send_priority=refuse or "auto",
                otel=False,
                poll_metrics_s=None,
            ) as rt,
            rt.job("wire") as job,
            job.session("s"),
        ):
            client = rt.http_client()
            content = json.dumps(body).encode()
            url = endpoints[0] if isinstance(endpoints[0], str) else endpoints[0].url
            async with client.stream(
                "POST", url + "/chat/completions", content=content, headers=HEADERS
            ) as response:
                await response.aread()
                assert response.status_code == 200
    return sent


CLIENTS_ENCODINGS = "<the HTTP client's own>"
"""What the HTTP client's default ``Accept-Encoding`` reads as here: its value depends on
the decoders installed (httpx adds ``zstd`` with zstandard), not on agentrt."""


def _show(sent: list[Sent]) -> list[Any]:
    def header(k: bytes, v: bytes) -> tuple[str, str]:
        return k.decode(), CLIENTS_ENCODINGS if k == b"Accept-Encoding" else v.decode()

    return [(url, [header(k, v) for k, v in h], b.decode()) for url, h, b in sent]


PLAIN = {"model": "m", "messages": MSG, "max_tokens": 8}
STREAMED = {"model": "m", "messages": MSG, "stream": True}
STREAMED_OPTIONS = {"model": "m", "messages": MSG, "stream": True, "stream_options": {"x": 1}}


@pytest.mark.parametrize("lib", HTTP_LIBS, ids=lambda m: m.__name__)
async def test_plain(lib: Any) -> None:
    assert _show(await _calls(lib, [A], PLAIN)) == EXPECTED["plain"]


@pytest.mark.parametrize("lib", HTTP_LIBS, ids=lambda m: m.__name__)
async def test_plain_with_body_fields(lib: Any) -> None:
    assert _show(await _calls(lib, [A], PLAIN, dialect="vllm")) == EXPECTED["plain_vllm"]


@pytest.mark.parametrize("lib", HTTP_LIBS, ids=lambda m: m.__name__)
async def test_streamed_without_usage(lib: Any) -> None:
    assert _show(await _calls(lib, [A], STREAMED)) == EXPECTED["streamed"]


@pytest.mark.parametrize("lib", HTTP_LIBS, ids=lambda m: m.__name__)
async def test_streamed_with_body_fields(lib: Any) -> None:
    got = _show(await _calls(lib, [A], STREAMED_OPTIONS, dialect="vllm"))
    assert got == EXPECTED["streamed_vllm"]


@pytest.mark.parametrize("lib", HTTP_LIBS, ids=lambda m: m.__name__)
async def test_retried(lib: Any) -> None:
    got = _show(await _calls(lib, [A], STREAMED, dialect="vllm", fail=1))
    assert got == EXPECTED["retried"]


@pytest.mark.parametrize("lib", HTTP_LIBS, ids=lambda m: m.__name__)
async def test_priority_refused(lib: Any) -> None:
    """The resend without the priority, in the same attempt."""
    got = _show(await _calls(lib, [A], STREAMED, dialect="vllm", fail=1, refuse=True))
    assert got == EXPECTED["refused"]


@pytest.mark.parametrize("lib", HTTP_LIBS, ids=lambda m: m.__name__)
async def test_retried_elsewhere(lib: Any) -> None:
    """A streamed call without usage; its first attempt's endpoint cannot be reached, the
    retry goes to the other, whose dialect adds no body field (or the other way round):
    each request is what its own endpoint's dialect makes of the call."""
    endpoints = [Endpoint(A, dialect="vllm"), Endpoint(B, dialect="generic")]
    got = _show(await _calls(lib, endpoints, STREAMED, fail=1, error=True))
    assert len(got) == 2
    assert got[0][0][:12] != got[1][0][:12]
    by_host = {url[:12]: sent for url, *sent in got}
    assert by_host == EXPECTED["elsewhere"]


# -- the bytes pinned ----------------------------------------------------------------------

JOB, SESSION, CALL = "job-61794732d252ee12", "ses-c509bc1015ac2041", "call-e78802d3bfd9208a"
TAG = f'v=2, job="{JOB}", session="{SESSION}", call="{CALL}", turn=0, svc-s=0.0, svc-tok=0'
CALLER = [("Accept", "*/*"), ("Connection", "keep-alive"), *HEADERS.items()]
"""The caller's headers after ``Host`` (httpx's client's, but its Accept-Encoding)."""
ASK = [*CALLER, ("accept-encoding", "identity")]
"""The same with agentrt's ``Accept-Encoding: identity`` (a streamed call it asks usage of)."""
VLLM = [("x-session-id", SESSION), ("x-request-id", CALL)]
HOST = [("Host", "a.test")]
URL_A = A + "/chat/completions"
MESSAGES = '"messages":[{"role":"user","content":"hi"}]'
USAGE = '{"model":"m",' + MESSAGES + ',"stream":true,"stream_options":{"include_usage":true}'
USAGE_VLLM = USAGE + f',"session_id":"{SESSION}"}}'
ENCODED = [("Accept", "*/*"), ("Accept-Encoding", CLIENTS_ENCODINGS), ("Connection", "keep-alive")]

EXPECTED: dict[str, Any] = {
    "plain": [
        (
            URL_A,
            [*HOST, *ENCODED, *HEADERS.items(), ("Content-Length", "80"), ("x-agentrt", TAG)],
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}',
        )
    ],
    "plain_vllm": [
        (
            URL_A,
            [
                *HOST,
                *ENCODED,
                *HEADERS.items(),
                ("x-agentrt", TAG),
                *VLLM,
                ("content-length", "108"),
            ],
            '{"model":"m",' + MESSAGES + f',"max_tokens":8,"session_id":"{SESSION}"}}',
        )
    ],
    "streamed": [
        (URL_A, [*HOST, *ASK, ("Content-Length", "111"), ("x-agentrt", TAG)], USAGE + "}"),
    ],
    "streamed_vllm": [
        (
            URL_A,
            [*HOST, *ASK, ("x-agentrt", TAG), *VLLM, ("content-length", "153")],
            '{"model":"m",'
            + MESSAGES
            + ',"stream":true,"stream_options":{"x":1,"include_usage":true},'
            + f'"session_id":"{SESSION}"}}',
        )
    ],
    "retried": [
        (URL_A, [*HOST, *ASK, ("x-agentrt", TAG), *VLLM, ("content-length", "147")], USAGE_VLLM),
    ]
    * 2,
    "refused": [
        (
            URL_A,
            [*HOST, *ASK, ("x-agentrt", TAG + ", prio=0"), *VLLM, ("content-length", "160")],
            USAGE + f',"session_id":"{SESSION}","priority":0}}',
        ),
        (URL_A, [*HOST, *ASK, ("x-agentrt", TAG), *VLLM, ("content-length", "147")], USAGE_VLLM),
    ],
    "elsewhere": {
        "http://a.tes": [
            [*HOST, *ASK, ("x-agentrt", TAG), *VLLM, ("content-length", "147")],
            USAGE_VLLM,
        ],
        "http://b.tes": [
            [*ASK, ("Content-Length", "111"), ("x-agentrt", TAG), ("host", "b.test")],
            USAGE + "}",
        ],
    },
}


# -- parsed once, serialized once per attempt -----------------------------------------------

NESTED = {"model": "m", "messages": MSG, "stream": True, "max_tokens": 8, "nvext": {"x": 1}}


@pytest.mark.parametrize("first", ["dynamo", "generic"])
async def test_a_dialects_nested_fields_stay_out_of_the_callers_body(first: str) -> None:
    """A dialect's fields merged into a dict the caller set (Dynamo's ``nvext``) are
    merged into a copy: the call's next attempt, to an endpoint of another dialect, sends
    the caller's dict as it was."""
    import httpx

    other = "generic" if first == "dynamo" else "dynamo"
    endpoints = [Endpoint(A, dialect=first), Endpoint(B, dialect=other)]
    got = await _calls(httpx, endpoints, NESTED, fail=1, error=True)
    assert len(got) == 2
    for url, _, body in got:
        nvext = json.loads(body)["nvext"]
        dynamo = url.startswith(A) == (first == "dynamo")
        assert nvext == ({"x": 1, "agent_hints": {"osl": 8}} if dynamo else {"x": 1})


@pytest.mark.parametrize(
    ("body", "dialect", "fail", "parsed", "serialized"),
    [
        (PLAIN, "generic", 0, 1, 0),
        (PLAIN, "vllm", 1, 1, 2),
        (STREAMED, "generic", 0, 1, 1),
        (STREAMED, "generic", 2, 1, 1),
        (STREAMED, "vllm", 0, 1, 1),
        (STREAMED, "vllm", 2, 1, 3),
    ],
)
async def test_the_body_is_parsed_once_and_serialized_once_per_attempt(
    monkeypatch: pytest.MonkeyPatch,
    body: dict[str, Any],
    dialect: str,
    fail: int,
    parsed: int,
    serialized: int,
) -> None:
    """Parsed once per call; serialized once per attempt where a dialect adds body fields,
    else once per call where agentrt asks for the stream's usage, else never."""
    import httpx

    import agentrt._transport._call
    import agentrt._transport._outgoing

    counts = {"parsed": 0, "serialized": 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            counts[name] += 1
            return fn(*args)

        return wrapper

    monkeypatch.setattr(
        agentrt._transport._call,
        "request_body",
        counted("parsed", agentrt._transport._call.request_body),
    )
    monkeypatch.setattr(
        agentrt._transport._outgoing,
        "json_bytes",
        counted("serialized", agentrt._transport._outgoing.json_bytes),
    )
    sent = await _calls(httpx, [A], body, dialect=dialect, fail=fail)
    assert len(sent) == fail + 1
    assert counts == {"parsed": parsed, "serialized": serialized}
