"""A server that is not there: the error says what to do (is the server running at the
URL? check it), names agentrt's public exception (``agentrt.EndpointError``, as httpx's
say ``httpx.ConnectError``) and keeps the transport's error as its ``error``, unchained;
a timeout and a dropped connection say what happened too."""

from __future__ import annotations

import traceback
from typing import Any

import openai
import pytest
from _faultserver import Fault, fault_server, refused_url, silent_listener

import agentrt

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = agentrt.Retry(attempts=2, wait_initial=0.0, wait_jitter=0.0)
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def last_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].rstrip("\n")


@pytest.mark.parametrize("how", ["session.chat", "rt.openai()"])
async def test_a_refused_connection_says_what_to_do(how: str) -> None:
    url = refused_url()
    async with agentrt.Runtime([url], retry=FAST, otel=False) as rt:
        with pytest.raises(agentrt.EndpointError) as info:
            async with rt.job("j") as job, job.session() as s:
                if how == "session.chat":
                    await s.chat(model="m", messages=MESSAGES)
                else:
                    await rt.openai().chat.completions.create(model="m", messages=MESSAGES)
    exc = info.value
    line = last_line(exc)
    assert line.startswith(f"agentrt.EndpointError: endpoint {url} failed after 2 attempt(s): ")
    assert "ConnectError" in line
    assert f"is a server running at {url}? Check the URL" in line
    # The transport's error is kept as .error, not chained: a traceback is agentrt's one
    # exception, not three (httpcore's, httpx's, then agentrt's).
    assert type(exc.error).__name__ == "ConnectError"  # (httpx or httpx2)
    assert exc.__cause__ is None and exc.__suppress_context__
    shown = "".join(traceback.format_exception(exc))
    assert "direct cause" not in shown and "During handling" not in shown
    assert shown.count("Traceback (most recent call last)") == 1, shown
    # An OpenAIError too: openai's clients (2.x as 3.x) pass it on unwrapped, unretried.
    assert isinstance(exc, openai.OpenAIError)
    assert job.report.error is not None and "is a server running" in job.report.error


async def test_a_timeout_and_a_dropped_connection_say_what_happened() -> None:
    with silent_listener() as url:
        async with agentrt.Runtime([url], retry=FAST, otel=False, timeout_s=0.3) as rt:
            with pytest.raises(agentrt.EndpointError) as info:
                async with rt.job("j") as job, job.session() as s:
                    await s.chat(model="m", messages=MESSAGES)
    assert "did not answer within" in str(info.value) and "timeout_s" in str(info.value)
    with fault_server(Fault.drop()) as server:
        async with agentrt.Runtime([server.url], retry=FAST, otel=False) as rt:
            with pytest.raises(agentrt.EndpointError) as info:
                async with rt.job("j") as job, job.session() as s:
                    await s.chat(model="m", messages=MESSAGES)
    assert "closed the connection" in str(info.value)


def test_the_sync_runtime_says_it_too() -> None:
    url = refused_url()
    with agentrt.SyncRuntime([url], retry=FAST, otel=False) as rt:
        with pytest.raises(agentrt.EndpointError) as info:
            with rt.job("j") as job, job.session() as s:
                s.chat(model="m", messages=MESSAGES)
        with pytest.raises((agentrt.EndpointError, openai.APIConnectionError)) as raw:
            rt.openai().chat.completions.create(model="m", messages=MESSAGES)
    assert f"is a server running at {url}?" in str(info.value)
    assert f"is a server running at {url}?" in f"{raw.value} {raw.value.__cause__}"
