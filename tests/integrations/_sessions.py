"""A transport that records the session of each chat request, read from its ``x-agentrt``
header as a server reads it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from agentrt import JobReport, Runtime
from agentrt._protocol import parse_agentrt_header
from agentrt.sim import PRESETS, Cluster


class SessionRecorder(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.sessions: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            self.sessions.append(parse_agentrt_header(request.headers["x-agentrt"]).session_id)
        return await self.inner.handle_async_request(request)


def lead_and_helper_question(helper_tool: str, helper_arg: str) -> str:
    """A scripted run (docs/sim.md): ``lead`` adds, then asks ``helper`` (through
    ``helper_tool``, whose argument is ``helper_arg``), which adds, then ``lead`` answers
    ``three``."""
    task = 'Sum.\nCALL add {"a": 5, "b": 6}\nANSWER eleven'
    return (
        f'Go.\nCALL add {{"a": 1, "b": 2}}\nCALL {helper_tool} '
        f"{json.dumps({helper_arg: task})}\nANSWER three"
    )


def check_lead_and_helper(report: JobReport, sessions: list[str], helper_tool: str) -> None:
    """The job of that run: one job named ``lead``, the helper's session under lead's,
    each request on the wire in its agent's session, each tool wait in its agent's."""
    assert (report.name, report.status, report.calls, report.sessions) == ("lead", "ok", 5, 2)
    lead, helper = report.session_reports
    assert (lead.name, lead.parent_id) == ("lead", None)
    assert (helper.name, helper.parent_id) == ("helper", lead.session_id)
    assert sessions == [lead.session_id] * 2 + [helper.session_id] * 2 + [lead.session_id]
    assert [(t.name, t.session_id, t.status) for t in report.tool_reports] == [
        ("add", lead.session_id, "ok"),
        ("add", helper.session_id, "ok"),
        (helper_tool, lead.session_id, "ok"),
    ]


@asynccontextmanager
async def scripted_runtime() -> AsyncIterator[tuple[Runtime, SessionRecorder]]:
    """A runtime on one embedded engine in its scripted-reply mode, whose requests are
    recorded."""
    async with Cluster(1, PRESETS["h100-8b"].replace(replies="agent")) as cluster:
        server = SessionRecorder(cluster.transport())
        async with Runtime(cluster.base_urls, transport=server) as rt:
            yield rt, server
