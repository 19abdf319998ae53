"""``send_priority=True`` against a real vLLM CPU replica started WITHOUT
``--scheduling-policy priority`` (the ``vllm_engine`` fixture: FCFS).

A vLLM that checks the field answers a non-zero priority with HTTP 400 ``Got priority N but
Priority scheduling is not enabled.``; agentrt then resends the call without it and sends
that endpoint no more. The test first asks the replica itself (a raw request, no agentrt)
whether it refuses, then checks that agentrt's calls succeed either way and that what they
carried matches: a fallback exactly when the server refuses, plain pass-through when it
takes the field. A few short calls.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

import agentrt
from agentrt import Endpoint, Retry
from agentrt.scheduling import FCFS, Ticket
from agentrt.telemetry import CallSent, Event
from agentrt.testing.vllm_cpu import ReplicaServer

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

LEVEL = 3


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Level(FCFS):
    """First come first served, every call at queue level 3 (vLLM checks only non-zero)."""

    def classify(self, ticket: Ticket, now: float) -> int:
        ticket.priority = LEVEL
        return LEVEL


def _body(replica: ReplicaServer, **extra: Any) -> dict[str, Any]:
    return {
        "model": replica.model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 2,
        **extra,
    }


async def test_send_priority_true_works_on_a_vllm_without_priority_scheduling(
    vllm_engine: ReplicaServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentrt")
    async with httpx.AsyncClient(timeout=120.0) as raw:
        answer = await raw.post(
            vllm_engine.base_url + "/chat/completions", json=_body(vllm_engine, priority=LEVEL)
        )
    refuses = answer.status_code == 400
    if refuses:
        assert "Priority scheduling is not enabled" in answer.text, answer.text
    else:
        assert answer.status_code == 200, answer.text

    events: list[Event] = []
    rt = agentrt.Runtime(
        [Endpoint(vllm_engine.base_url, send_priority=True)],
        dialect="vllm",
        policy=Level,
        retry=Retry(attempts=1),  # a resend that spent an attempt would fail the call
        hooks=[events.append],
        timeout_s=120,
    )
    async with rt:
        async with rt.job("priority-fallback") as job, job.session() as s:
            for _ in range(2):
                reply = await s.chat(**_body(vllm_engine))
                assert reply.choices and reply.usage is not None
    reports = job.report.call_reports
    assert [(r.status, r.attempts, r.http_status) for r in reports] == [("ok", 1, 200)] * 2
    sent = [e.priority for e in events if isinstance(e, CallSent)]
    refused = rt._core.endpoints[0].priority_refused
    warned = [r.getMessage() for r in caplog.records if "refused a call's priority" in r.message]
    if refuses:
        # Refused once, resent without it; the second call carried none.
        assert sent == [LEVEL, None, None] and refused == 1
        assert len(warned) == 1 and vllm_engine.base_url in warned[0]
        assert [r.priority for r in reports] == [None, None]
    else:
        # This vLLM takes the field under FCFS (and ignores it): nothing to fall back from.
        assert sent == [LEVEL, LEVEL] and refused == 0 and warned == []
        assert [r.priority for r in reports] == [LEVEL, LEVEL]
