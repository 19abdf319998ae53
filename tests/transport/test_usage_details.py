"""Reasoning and cache-write tokens: read from a reply's usage (chat, its stream, the
Responses API) into CallReport, JobReport, the journal and ``agentrt report`` (issue 36)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrt import Runtime
from agentrt.report._stats import summarize
from agentrt.report._tables import SUMMARY_HEADERS, summary_table
from agentrt.telemetry._journal import read_journal
from tests._fake import MSG, FakeEngine, chat_completion, sse_event

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"

USAGE: dict[str, Any] = {
    "prompt_tokens": 1000,
    "completion_tokens": 300,
    "total_tokens": 1300,
    # OpenAI's field names (the API reference's CompletionUsage).
    "prompt_tokens_details": {"cached_tokens": 600, "cache_write_tokens": 400},
    "completion_tokens_details": {"reasoning_tokens": 200},
}


def chat_reply(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=chat_completion({"role": "assistant", "content": "x"}, USAGE))


def stream_reply(request: httpx.Request) -> httpx.Response:
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}],
    }
    last = {**chunk, "choices": [], "usage": USAGE}

    async def events() -> AsyncIterator[bytes]:  # streamed: httpx reads bytes content at once
        for c in (chunk, last):
            yield sse_event(c)
        yield b"data: [DONE]\n\n"

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())


def responses_reply(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": "m",
            "status": "completed",
            "output": [],
            "usage": {
                "input_tokens": 50,
                "output_tokens": 40,
                "total_tokens": 90,
                "input_tokens_details": {"cached_tokens": 10},
                "output_tokens_details": {"reasoning_tokens": 25},
            },
        },
    )


async def test_chat_and_its_stream_report_reasoning_and_cache_write_tokens(tmp_path: Path) -> None:
    fake = FakeEngine()
    fake.script = [chat_reply, stream_reply]
    journal = tmp_path / "j.jsonl"
    async with Runtime([URL], transport=fake.transport(), journal=journal) as rt:
        async with rt.job("think") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            client = rt.openai()
            stream = await client.chat.completions.create(model="m", messages=MSG, stream=True)  # type: ignore[arg-type]
            async for _ in stream:
                pass
            await s.chat(model="m", messages=MSG)  # the fake's plain usage: no details
    plain, streamed, bare = job.report.call_reports
    for c in (plain, streamed):
        assert (c.cached_tokens, c.cache_write_tokens, c.reasoning_tokens) == (600, 400, 200)
    assert (bare.cache_write_tokens, bare.reasoning_tokens) == (None, None)
    rep = job.report
    assert (rep.cache_write_tokens, rep.reasoning_tokens) == (800, 400)
    assert "of which 400 reasoning, 800 written to cache" in str(rep)
    assert all(len(line) <= 80 for line in str(rep).splitlines())

    (read,) = read_journal(journal)
    line = json.loads(journal.read_text().splitlines()[0])
    assert (line["cache_write_tokens"], line["reasoning_tokens"]) == (800, 400)
    assert line["call_reports"][0]["cache_write_tokens"] == 400
    assert line["call_reports"][1]["reasoning_tokens"] == 200
    assert read.reasoning_tokens == 400

    # agentrt report: reasoning over completion tokens, cache writes over prompt tokens.
    (summary,) = summarize([read])
    prompt, completion = rep.prompt_tokens, rep.completion_tokens
    assert summary.cache_write_share == pytest.approx(800 / prompt)
    assert summary.reasoning_share == pytest.approx(400 / completion)
    table = summary_table([summary], "t")
    row = dict(zip(SUMMARY_HEADERS, table.rows[0], strict=True))
    assert row["reasoning"] == f"{400 / completion:.0%}"
    assert row["cache wr"] == f"{800 / prompt:.0%}"


async def test_a_journal_without_the_new_fields_still_reads(tmp_path: Path) -> None:
    fake = FakeEngine()
    journal = tmp_path / "j.jsonl"
    async with Runtime([URL], transport=fake.transport(), journal=journal) as rt:
        async with rt.job("old") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    line = json.loads(journal.read_text())
    del line["cache_write_tokens"], line["reasoning_tokens"]
    for c in line["call_reports"]:
        del c["cache_write_tokens"], c["reasoning_tokens"]
    journal.write_text(json.dumps(line) + "\n")
    (read,) = read_journal(journal)
    assert (read.cache_write_tokens, read.reasoning_tokens) == (0, 0)
    (summary,) = summarize([read])
    assert (summary.cache_write_share, summary.reasoning_share) == (None, None)
    assert job.report.call_reports[0].reasoning_tokens is None


async def test_the_responses_api_reports_reasoning_tokens() -> None:
    fake = FakeEngine()
    fake.script = [responses_reply]
    async with Runtime([URL], transport=fake.transport()) as rt:
        async with rt.job("r") as job, job.session():
            await rt.openai().responses.create(model="m", input="hi")
    (c,) = job.report.call_reports
    assert (c.prompt_tokens, c.cached_tokens, c.reasoning_tokens) == (50, 10, 25)
    assert c.cache_write_tokens is None
