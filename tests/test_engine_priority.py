"""The engine priority under Runtime's defaults (FCFS): the job's attained-service level,
sent only to endpoints that take priorities (issue 34: short jobs' calls first)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from trio.testing import MockClock

from agentrt import Endpoint, Retry, Runtime
from agentrt._protocol import parse_agentrt_header
from agentrt.scheduling import ATLAS, EDF, FCFS, MLFQ, PLAS, Ticket, plas_priority
from agentrt.scheduling._queue import engine_level
from tests._fake import FakeEngine

pytestmark = pytest.mark.anyio

ACCEPTS = "http://accepts.test/v1"
PLAIN = "http://plain.test/v1"
MSG = [{"role": "user", "content": "hi"}]
CALL_S = 3.0
"""Each reply's latency (virtual time): the service a call adds to its job."""


@pytest.fixture
def anyio_backend() -> Any:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


class _Level3(FCFS):
    def classify(self, ticket: Ticket, now: float) -> int:
        ticket.priority = 3
        return 3


def test_fcfs_sends_the_jobs_attained_service_level() -> None:
    for service in (0.0, 0.5, 1.0, 3.9, 4.0, 20.0, 100.0, 300.0, 1e6):
        assert engine_level(FCFS(), 0, service) == plas_priority(service)
    assert [engine_level(FCFS(), 0, s) for s in (0.0, 2.0, 10.0, 50.0, 200.0, 900.0)] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]


def test_other_policies_send_their_own_level() -> None:
    for policy in (PLAS(), ATLAS(), MLFQ(), EDF(), _Level3()):
        assert engine_level(policy, 2, 900.0) == 2
        assert engine_level(policy, 0, 900.0) == 0


class _Engines(FakeEngine):
    """Two engines: ``accepts.test`` advertises ``x-agentrt-accept: priority`` (it
    schedules by priority), ``plain.test`` advertises nothing."""

    async def handle(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle(request)
        if "accepts.test" in str(request.url):
            response.headers["x-agentrt-accept"] = "priority"
        return response


def _priorities(fake: FakeEngine, host: str) -> list[tuple[object, int | None]]:
    """(body ``priority``, the ``x-agentrt`` header's priority) of each call to ``host``."""
    return [
        (s.body.get("priority", "absent"), parse_agentrt_header(s.headers["x-agentrt"]).priority)
        for s in fake.seen
        if host in s.url
    ]


async def test_defaults_send_the_attained_level_only_where_accepted() -> None:
    """Runtime's defaults (FCFS, ``send_priority="auto"``): once an endpoint advertised
    priority scheduling, each call to it carries its job's attained-service level; the
    endpoint that did not ask gets no priority at all."""
    fake = _Engines(delay_s=CALL_S)
    async with Runtime(
        [ACCEPTS, PLAIN],
        dialect="vllm",
        routing="round_robin",
        transport=fake.transport(),
        retry=Retry(attempts=1),
        poll_metrics_s=None,
    ) as rt:
        async with rt.job("long") as job, job.session() as s:
            for _ in range(12):
                await s.chat(model="m", messages=MSG)
        async with rt.job("short") as job2, job2.session() as s2:
            await s2.chat(model="m", messages=MSG)
    calls = job.report.call_reports + job2.report.call_reports
    assert len(calls) == 13
    to_accepts = _priorities(fake, "accepts.test")
    to_plain = _priorities(fake, "plain.test")
    assert to_plain and all(p == ("absent", None) for p in to_plain)
    # The first call learns that accepts.test takes priorities (from its reply).
    assert to_accepts[0] == ("absent", None)
    # Then the long job's service (3 s a call, every other call there) raises its level:
    # calls 3, 5, ..., 11 of the long job after 6, 12, ... 30 s of service.
    long_sent = [p for p, _ in to_accepts[1:6]]
    assert long_sent == [plas_priority(CALL_S * k) for k in (2, 4, 6, 8, 10)]
    assert long_sent == [2, 2, 3, 3, 3]
    assert all(body == header for body, header in to_accepts[1:])
    # A new job's first call goes at level 0, ahead of the long job's.
    assert calls[-1].endpoint == ACCEPTS and to_accepts[-1] == (0, 0)
    assert [c.priority for c in calls if c.endpoint == PLAIN] == [None] * 6


async def _four_calls(fake: FakeEngine, endpoint: str | Endpoint, **kwargs: Any) -> list[Any]:
    """The ``priority`` body field (None: absent) of a job's four calls to one endpoint."""
    async with Runtime(
        [endpoint], dialect="vllm", transport=fake.transport(), retry=Retry(attempts=1), **kwargs
    ) as rt:
        async with rt.job("j") as job, job.session() as s:
            for _ in range(4):
                await s.chat(model="m", messages=MSG)
    return [seen.body.get("priority") for seen in fake.seen]


async def test_no_priority_without_acceptance_or_when_off() -> None:
    assert await _four_calls(FakeEngine(delay_s=CALL_S), PLAIN) == [None] * 4
    off = Endpoint(ACCEPTS, send_priority=False)
    assert await _four_calls(_Engines(delay_s=CALL_S), off) == [None] * 4


async def test_send_priority_true_sends_the_level_to_every_endpoint() -> None:
    sent = await _four_calls(FakeEngine(delay_s=CALL_S), PLAIN, send_priority=True)
    assert sent == [0, 1, 2, 2]
