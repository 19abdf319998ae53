"""Typed use of agentrt's public API: tests/test_typing.py runs ``mypy --strict`` over it.

Never run, only type-checked (pytest collects nothing here). The annotated assignments
state the type each call must have, with no cast or ``type: ignore`` anywhere; the
misuses that must fail are in tests/typed/wrong.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import tenacity
from openai import AsyncStream
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

import agentrt


async def chat_and_stream(rt: agentrt.Runtime) -> str:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    async with rt.job("typed") as job, job.session("s") as s:
        reply: ChatCompletion = await s.chat(model="m", messages=messages, max_tokens=8)
        text: str | None = reply.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        plain = await s.chat(model="m", messages=messages, stream=False, temperature=0.0)
        assert plain.usage is None or plain.usage.prompt_tokens >= 0
        stream = await s.chat(
            model="m",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"top_k": 1},
            extra_headers={"x-a": "b"},
            timeout=10.0,
        )
        chunks: AsyncStream[ChatCompletionChunk] = stream
        parts: list[str] = []
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        flag: bool = len(parts) > 3
        either = await s.chat(model="m", messages=messages, stream=flag)
        if isinstance(either, ChatCompletion):
            parts.append(either.choices[0].message.content or "")
        else:
            async for chunk in either:
                parts.append(chunk.id)
        done: Completion = await s.complete(model="m", prompt="def f():", max_tokens=4)
        parts.append(done.choices[0].text)
        async for piece in await s.complete(model="m", prompt="x", stream=True):
            parts.append(piece.choices[0].text if piece.choices else "")
        async with s.tool("pytest", expected_s=1.0):
            await anyio.sleep(0.01)
    report: agentrt.JobReport = job.report
    return "".join(parts) + f"{report.jct_s:.2f}"


def sync_chat(srt: agentrt.SyncRuntime) -> str:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    with srt.job("typed") as job, job.session("s") as s:
        reply: ChatCompletion = s.chat(model="m", messages=messages)
        out = reply.choices[0].message.content or ""
        chunks: Iterator[ChatCompletionChunk] = s.chat(model="m", messages=messages, stream=True)
        for chunk in chunks:
            out += chunk.choices[0].delta.content or "" if chunk.choices else ""
        text: Completion = s.complete(model="m", prompt="x")
        out += text.choices[0].text
        for piece in s.complete(model="m", prompt="x", stream=True):
            out += piece.id
    return out


async def openai_client(rt: agentrt.Runtime) -> str | None:
    client = rt.openai()
    async with rt.job("typed") as job, job.session("s"):
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    return reply.choices[0].message.content


def configured(path: str) -> agentrt.Runtime:
    """A settings file, with an explicit argument that wins over it."""
    return agentrt.Runtime(
        ["http://127.0.0.1:8000/v1"], config=path, concurrency="engine", send_priority="auto"
    )


def tenacity_retry() -> agentrt.Retry:
    """Retry takes tenacity's own strategies, and a plain callable of the retry state."""

    def not_conflicts(exc: BaseException) -> bool:
        return not (isinstance(exc, agentrt.AttemptError) and exc.status == 409)

    return agentrt.Retry(
        stop=tenacity.stop_after_attempt(5) | tenacity.stop_after_delay(30.0),
        wait=tenacity.wait_random_exponential(multiplier=0.5, max=10.0),
        retry=tenacity.retry_if_exception(not_conflicts),
    )


def sync_configured(path: str) -> agentrt.SyncRuntime:
    """SyncRuntime takes Runtime's keyword arguments, typed as Runtime types them."""
    return agentrt.SyncRuntime(
        ["http://127.0.0.1:8000/v1"],
        backend="trio",
        config=path,
        concurrency="auto",
        policy="plas",
        keep_reports=10,
        retry=agentrt.Retry(attempts=2),
        timeout_s=30.0,
        otel=False,
    )
