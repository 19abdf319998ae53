"""Readable objects: the runtimes' reprs, and a JobReport that prints as a short summary
while its repr and model_dump() keep every field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agentrt import Endpoint, Runtime, SyncRuntime
from agentrt.sim import Cluster
from agentrt.telemetry import JobReport
from agentrt.telemetry._report import _durations
from tests._fake import MSG, FakeEngine
from tests.sim._helpers import small_config

URLS = ["http://a.test/v1", "http://b.test/v1"]


def test_sync_runtime_repr_is_like_runtimes() -> None:
    rt = Runtime(URLS, routing="least_loaded")
    srt = SyncRuntime(URLS, routing="least_loaded", backend="trio")
    assert (
        repr(rt)
        == "<agentrt.Runtime endpoints=" + repr(URLS) + " routing='least_loaded' not entered>"
    )
    assert repr(srt) == (
        "<agentrt.SyncRuntime endpoints="
        + repr(URLS)
        + " routing='least_loaded' backend='trio' not entered>"
    )
    with SyncRuntime([Endpoint(URLS[0], api_key="sk-x")], transport=FakeEngine().transport()) as s:
        assert repr(s) == (
            f"<agentrt.SyncRuntime endpoints={[URLS[0]]!r} routing='session_affinity' "
            "backend='asyncio' open>"
        )
        assert repr(s.runtime).endswith(" open>")
    assert repr(s).endswith(" closed>") and "sk-x" not in repr(s)


@pytest.mark.anyio
async def test_a_job_report_prints_a_short_summary() -> None:
    async with Cluster(1, small_config()) as cluster:
        async with Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt:
            async with rt.job("fix-bug", deadline_s=30) as job:
                async with job.session("main") as s:
                    await s.chat(model="m", messages=MSG, max_tokens=3)
                    async with s.tool("grep"):
                        pass
                    await s.chat(model="m", messages=MSG, max_tokens=3)
                async with job.session("sub"):
                    pass
    report = job.report
    text = str(report)
    lines = text.splitlines()
    assert 3 <= len(lines) <= 5 and all(len(line) <= 80 for line in lines)
    assert lines[0] == f"job fix-bug ({report.job_id}): ok, deadline 30 s"
    jct, llm, tools, queued = _durations(
        report.jct_s, report.critical_llm_s, report.tool_s, report.queue_s
    )
    assert lines[1] == f"  JCT     {jct}: LLM {llm}, tools {tools}, queued {queued}"
    units = {part.split()[-1].rstrip(",") for part in lines[1].split(":")[1].split(", ")}
    assert len(units) == 1, lines[1]  # one unit on the line (issue 35, item 14)
    assert lines[2] == "  calls   2 in 2 sessions, 1 tool wait"
    assert report.prompt_tokens > 0 and report.cache_hit_rate is not None
    assert lines[3] == (
        f"  tokens  {report.prompt_tokens:,} prompt, {report.completion_tokens:,} completion; "
        f"cache hit {report.cache_hit_rate:.0%} ({report.cached_tokens:,} cached)"
    )
    # The full model is still there: repr and model_dump are pydantic's.
    assert repr(report).startswith("JobReport(job_id=") and "call_reports=[CallReport(" in repr(
        report
    )
    assert JobReport.model_validate(report.model_dump()) == report
    assert f"{report}" == text


def test_a_failed_job_report_names_its_error_in_one_line() -> None:
    data: dict[str, Any] = {
        "job_id": "job-1",
        "name": "triage",
        "program_id": "job-1",
        "status": "error",
        "error": "RuntimeError: " + "a long\nmulti-line error " * 10,
        "started_at": datetime.now(UTC),
        "jct_s": 1234.5,
        "llm_s": 0.0,
        "critical_llm_s": 0.0,
        "queue_s": 0.0,
        "tool_s": 0.25,
        "calls": 0,
        "tool_waits": 2,
        "sessions": 1,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "retries": 3,
        "session_moves": 1,
    }
    lines = str(JobReport(**data)).splitlines()
    assert lines[0] == "job triage (job-1): error"
    assert lines[1] == "  JCT     1234 s: LLM 0 s, tools 0.25 s, queued 0 s"  # one unit
    assert lines[2] == "  calls   0 in 1 session (3 retries, 1 session move), 2 tool waits"
    assert lines[3].endswith("cache hit n/a")
    assert lines[4].startswith("  error   RuntimeError: a long multi-line error a long")
    assert lines[4].endswith("…") and len(lines[4]) <= 80 and len(lines) == 5


def test_durations_shown_together_share_one_unit() -> None:
    """(issue 35, item 14) ``363 ms`` beside ``0 s`` read as two units."""
    from agentrt.telemetry._report import _durations

    assert _durations(0.363, 0.0, 0.0) == ["363 ms", "0 ms", "0 ms"]
    assert _durations(12.345, 0.25, 0.0) == ["12.35 s", "0.25 s", "0 s"]
