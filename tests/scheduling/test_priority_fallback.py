"""``send_priority=True`` toward a server that does not schedule by priority.

vLLM answers a non-zero ``priority`` with HTTP 400 ``Got priority N but Priority
scheduling is not enabled.`` unless it was started with ``--scheduling-policy priority``.
agentrt then resends that call once without the priority (in the same attempt: no retry
is used up), sends that endpoint no more priorities, and warns once. Wire-format unit
tests: a MockTransport (of httpx, and of httpx2 where installed) plays the server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import openai
import pytest

from agentrt import Endpoint, Retry, Runtime
from agentrt.scheduling import FCFS, Ticket
from agentrt.telemetry import AttemptFailed, CallSent, Event
from tests._fake import HTTP_LIBS, chat_completion, sse_event

pytestmark = pytest.mark.anyio

REFUSES = "http://refuses.test/v1"
ACCEPTS = "http://accepts.test/v1"
KEY = "sk-test-secret-4711"
MSG = [{"role": "user", "content": "hi"}]
ONE_TRY = Retry(attempts=1)
"""One attempt only: a resend that used up an attempt would fail the call."""
THREE_TRIES = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)


def vllm_refusal(priority: int) -> dict[str, Any]:
    """vLLM's answer, as its OpenAI server renders the engine's ValueError (ErrorResponse)."""
    return {
        "error": {
            "message": f"Got priority {priority} but Priority scheduling is not enabled.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }


class Level(FCFS):
    """First come first served, every call at queue level 3 (vLLM refuses only non-zero)."""

    def classify(self, ticket: Ticket, now: float) -> int:
        ticket.priority = 3
        return 3


@dataclass
class Server:
    """Two engines behind one MockTransport: ``refuses.test`` answers any request with a
    non-zero priority as a vLLM without priority scheduling does, ``accepts.test`` takes
    it. ``refusal`` replaces the 400 body (another 400); ``both_in`` holds each refusal
    until two requests are in (calls in flight together)."""

    lib: Any
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refusal: dict[str, Any] | None = None
    always_refuse: bool = False
    both_in: anyio.Event | None = None

    def transport(self) -> Any:
        return self.lib.MockTransport(self.handle)

    def sent(self, host: str) -> list[Any]:
        """The ``priority`` field of each request to ``host`` (None: absent)."""
        return [body.get("priority") for url, body in self.seen if host in url]

    async def handle(self, request: Any) -> Any:
        lib = self.lib
        body = json.loads(request.content)
        self.seen.append((str(request.url), body))
        priority = body.get("priority", 0)
        if "refuses.test" in str(request.url) and (priority != 0 or self.always_refuse):
            if self.both_in is not None:
                if len(self.seen) >= 2:
                    self.both_in.set()
                await self.both_in.wait()
            return lib.Response(400, json=self.refusal or vllm_refusal(priority))
        if body.get("stream"):
            return lib.Response(200, headers={"content-type": "text/event-stream"}, content=_sse())
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        return lib.Response(
            200, json=chat_completion({"role": "assistant", "content": "hello"}, usage)
        )

    def runtime(self, endpoints: list[Any] | None = None, **options: Any) -> Runtime:
        """A runtime in front of this server: vLLM's dialect, every call at level 3
        (:class:`Level`), one attempt; ``endpoints`` default to ``refuses.test`` with
        ``send_priority=True``; ``options`` add to or replace these."""
        settings: dict[str, Any] = {
            "dialect": "vllm",
            "policy": Level,
            "transport": self.transport(),
            "retry": ONE_TRY,
            **options,
        }
        if endpoints is None:
            endpoints = [Endpoint(REFUSES, send_priority=True)]
        return Runtime(endpoints, **settings)


async def _sse() -> AsyncIterator[bytes]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
        for w in ("a", "b")
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chunks.append({**base, "choices": [], "usage": usage})
    for chunk in chunks:
        yield sse_event(chunk)
    yield b"data: [DONE]\n\n"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("agentrt") and r.levelno >= logging.WARNING
    ]


@pytest.mark.parametrize("lib", HTTP_LIBS, ids=[m.__name__ for m in HTTP_LIBS])
async def test_refused_priority_is_resent_without_it_and_not_sent_again(
    lib: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="agentrt")
    server = Server(lib)
    events: list[Event] = []
    rt = server.runtime(api_key=KEY, hooks=[events.append])
    async with rt:
        async with rt.job("j") as job, job.session() as s:
            first = await s.chat(model="m", messages=MSG)
            second = await s.chat(model="m", messages=MSG)
    assert first.choices[0].message.content == "hello"
    assert second.choices[0].message.content == "hello"
    # The first call went with its priority, was refused, and went again without it;
    # the second went without one at once.
    assert server.sent("refuses.test") == [3, None, None]
    first_report, second_report = job.report.call_reports
    assert (first_report.status, first_report.attempts, first_report.http_status) == (
        "ok",
        1,
        200,
    )
    assert first_report.priority is None  # what the engine got in the end
    assert second_report.priority is None and second_report.attempts == 1
    # Hooks see the refused send (will_retry) and both sends of the one attempt.
    failed = [e for e in events if isinstance(e, AttemptFailed)]
    assert [(e.error, e.will_retry, e.attempt) for e in failed] == [("HTTP 400", True, 1)]
    sent = [e for e in events if isinstance(e, CallSent)]
    assert [(e.priority, e.attempt) for e in sent] == [(3, 1), (None, 1), (None, 1)]
    assert rt._core.endpoints[0].priority_refused == 1
    # One warning, naming the endpoint and how to silence it, never the key.
    (warning,) = warnings_of(caplog)
    assert REFUSES in warning
    assert "send_priority=False" in warning and "--scheduling-policy priority" in warning
    assert KEY not in caplog.text


async def test_another_endpoint_still_gets_priorities() -> None:
    import httpx

    server = Server(httpx)
    rt = server.runtime(
        [Endpoint(REFUSES), Endpoint(ACCEPTS)], routing="round_robin", send_priority=True
    )
    async with rt:
        client = rt.openai()
        for _ in range(4):
            await client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert server.sent("refuses.test") == [3, None, None]
    assert server.sent("accepts.test") == [3, 3]
    assert [e.priority_refused for e in rt._core.endpoints] == [1, 0]


async def test_a_streamed_call_is_resent_without_priority(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import httpx

    server = Server(httpx)
    rt = server.runtime()
    async with rt:
        async with rt.job("j") as job, job.session() as s:
            stream = await s.chat(model="m", messages=MSG, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            again = await s.chat(model="m", messages=MSG, stream=True)
            async for _ in again:
                pass
    assert text == "ab"
    assert server.sent("refuses.test") == [3, None, None]
    assert all(body["stream"] is True for _, body in server.seen)
    report = job.report.call_reports[0]
    assert (report.status, report.attempts, report.completion_tokens) == ("ok", 1, 2), report.error
    assert len(warnings_of(caplog)) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "max_tokens must be at least 1", "type": "BadRequestError"}},
        {"object": "error", "message": "priority must be an integer", "code": 400},
    ],
)
async def test_another_400_goes_to_the_caller_and_priorities_stay_on(
    body: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    import httpx

    server = Server(httpx, refusal=body)
    rt = server.runtime(retry=THREE_TRIES)
    async with rt:
        client = rt.openai()
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="m", messages=MSG, stream=stream)  # type: ignore[call-overload]
            assert caught.value.status_code == 400
    assert server.sent("refuses.test") == [3, 3]  # neither resent nor retried
    assert rt._core.endpoints[0].priority_refused == 0
    assert not any("refused a call's priority" in w for w in warnings_of(caplog))


async def test_the_resend_is_made_once() -> None:
    """A server that refuses the resend too (here: whatever the body) gets no third try:
    its 400 goes to the caller, and the endpoint's retries were not spent on it."""
    import httpx

    server = Server(httpx, always_refuse=True)
    rt = server.runtime(retry=THREE_TRIES)
    async with rt:
        async with rt.job("j") as job, job.session() as s:
            with pytest.raises(openai.BadRequestError, match="Priority scheduling"):
                await s.chat(model="m", messages=MSG)
    assert server.sent("refuses.test") == [3, None]
    report = job.report.call_reports[0]
    assert (report.status, report.attempts, report.http_status) == ("error", 1, 400)


async def test_a_priority_the_caller_set_is_not_dropped() -> None:
    """agentrt removes only its own priority: a caller's ``extra_body`` priority is sent
    again, and the engine's second refusal reaches the caller."""
    import httpx

    server = Server(httpx)
    rt = server.runtime()
    async with rt:
        client = rt.openai()
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(
                model="m",
                messages=MSG,  # type: ignore[arg-type]
                extra_body={"priority": 9},
            )
    assert server.sent("refuses.test") == [9, 9]


async def test_calls_in_flight_together_are_each_resent_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import httpx

    server = Server(httpx, both_in=anyio.Event())
    rt = server.runtime()
    replies: list[str | None] = []
    async with rt:
        client = rt.openai()

        async def call() -> None:
            r = await client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
            replies.append(r.choices[0].message.content)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                tg.start_soon(call)
    assert replies == ["hello", "hello"]
    assert sorted(server.sent("refuses.test"), key=str) == [3, 3, None, None]
    assert rt._core.endpoints[0].priority_refused == 2
    assert len(warnings_of(caplog)) == 1


@pytest.mark.parametrize("send_priority", ["auto", False])
async def test_auto_and_false_send_no_priority_to_such_a_server(
    send_priority: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import httpx

    server = Server(httpx)
    rt = server.runtime([REFUSES], send_priority=send_priority)
    async with rt:
        client = rt.openai()
        for _ in range(2):
            await client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert server.sent("refuses.test") == [None, None]
    assert rt._core.endpoints[0].priority_refused == 0
    assert warnings_of(caplog) == []
